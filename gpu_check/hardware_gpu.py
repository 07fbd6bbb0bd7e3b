"""Prints Vigil's NVML readings on a real GPU (a prepared device check): python gpu_check/hardware_gpu.py.

It samples the GPUs a few times while a matmul load runs, so that utilisation, power and temperature
move, and prints each reading in the units that the vigil_gpu_* metrics export.
"""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from telemetry.hardware import GpuReading, NvmlCollector  # noqa: E402


def busy_gpu(stop: threading.Event) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        (a @ a).sum().item()


def shown(value: float | None, format_spec: str, scale: float = 1.0) -> str:
    """A reading NVML could not give (None) prints as n/a."""
    return "n/a" if value is None else format(value / scale, format_spec)


def describe(r: GpuReading) -> str:
    return (
        f"gpu {r.index} ({r.name}): {shown(r.temperature_celsius, '.0f')} °C, "
        f"memory {shown(r.memory_used_bytes, '.1f', 2**30)}/{shown(r.memory_total_bytes, '.1f', 2**30)} GiB, "
        f"utilization {shown(r.utilization_ratio, '.2f')}, power {shown(r.power_watts, '.1f')} W, "
        f"throttled {r.throttled}, failed {', '.join(r.failed) or 'none'}"
    )


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
            for reading in collector.read():
                print(f"sample {sample} {describe(reading)}")
    finally:
        stop.set()
        load.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
