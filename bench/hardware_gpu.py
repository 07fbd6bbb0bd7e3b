"""Prints Vigil's NVML readings on a real GPU (a prepared device check): python bench/hardware_gpu.py.

It samples the GPUs a few times while a matmul load runs, so that utilisation, power and temperature
move, and prints each reading in the units that the vigil_gpu_* metrics export.
"""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from telemetry.hardware import NvmlCollector  # noqa: E402


def busy_gpu(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        (a @ a).sum().item()


def main() -> int:
    collector = NvmlCollector()
    print(f"vigil_gpu_count {collector.gpu_count}")
    if not collector.gpu_count:
        return 1
    stop = threading.Event()
    load = threading.Thread(target=busy_gpu, args=(stop,), daemon=True)
    load.start()
    try:
        for sample in range(5):
            time.sleep(1.0)
            for r in collector.read():
                print(
                    f"sample {sample} gpu {r.index} ({r.name}): {r.temperature_celsius:.0f} °C, "
                    f"memory {r.memory_used_bytes / 2**30:.1f}/{r.memory_total_bytes / 2**30:.1f} GiB, "
                    f"utilization {r.utilization_ratio:.2f}, power {r.power_watts:.1f} W, throttled {r.throttled}"
                )
    finally:
        stop.set()
        load.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
