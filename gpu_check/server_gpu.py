"""The server on the device, under load, exports live NVML series (step 3 of gpu_check/gpu_check.sh).

    python -m gpu_check.server_gpu                 # CUDA
    python -m gpu_check.server_gpu --device cpu    # dry run: the server and the scrapes on the CPU; NVML checks SKIP

Starts ``python -m server serve --device DEVICE`` on a free 127.0.0.1 port with a 1 s hardware interval, sends
``REQUESTS`` concurrent completions, and reads /metrics every second while they run. Checks: every request 200;
``vigil_engine_config_info`` names the device; ``vigil_gpu_count`` at least 1; per GPU a temperature in
(10, 95) °C, memory used in (0, total], utilisation in [0, 1] and above 0 in some reading, power in (20, 1500) W;
the last fully successful hardware sample under 10 s old. Prints PASS, FAIL or SKIP lines; exits 1 on a FAIL.
"""

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpu_check.checks import Checks
from server.bench.local_server import LocalServer

REQUESTS = 32
READY_TIMEOUT_S = 300.0


def complete(base_url: str, max_tokens: int) -> int:
    body = {"model": "vigil", "prompt": "Write a long story about the sea.", "max_tokens": max_tokens,
            "ignore_eos": True}
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=300).status_code


def scrape(base_url: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


def values(samples: dict, name: str) -> dict[str, float]:
    """``name``'s value per GPU index."""
    return {dict(labels)["gpu"]: value for (metric, labels), value in samples.items() if metric == name}


def check_gpus(checks: Checks, scrapes: list[dict]) -> None:
    last = scrapes[-1]
    count = last.get(("vigil_gpu_count", frozenset()), 0.0)
    if not checks.record("vigil_gpu_count is at least 1", count >= 1, f"{count:.0f}"):
        return
    for gpu, total in values(last, "vigil_gpu_memory_total_bytes").items():
        used = values(last, "vigil_gpu_memory_used_bytes")[gpu]
        temperature = values(last, "vigil_gpu_temperature_celsius")[gpu]
        power = values(last, "vigil_gpu_power_watts")[gpu]
        busiest = max(values(s, "vigil_gpu_utilization_ratio").get(gpu, 0.0) for s in scrapes)
        checks.record(f"gpu {gpu} temperature", 10 < temperature < 95, f"{temperature:.0f} °C")
        checks.record(f"gpu {gpu} memory", 0 < used <= total, f"{used / 2**30:.1f} of {total / 2**30:.1f} GiB")
        checks.record(f"gpu {gpu} utilisation under load", 0 < busiest <= 1, f"peak {busiest:.2f}")
        checks.record(f"gpu {gpu} power", 20 < power < 1500, f"{power:.0f} W")
    stamp = last.get(("vigil_hardware_last_success_timestamp_seconds", frozenset()), 0.0)
    checks.record("the last hardware sample is fresh", time.time() - stamp < 10, f"{time.time() - stamp:.1f} s old")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    dry = args.device == "cpu"
    checks = Checks()
    log = Path(tempfile.mkdtemp(prefix="vigil-server-gpu-")) / "server.log"
    flags = ["--device", args.device, "--dtype", "float32" if dry else "bfloat16", "--served-model-name", "vigil",
             "--hardware-interval", "1"]
    server = LocalServer(flags, log)
    try:
        server.wait_ready(READY_TIMEOUT_S)
        scrapes = []
        with ThreadPoolExecutor(REQUESTS) as pool:
            pending = [pool.submit(complete, server.base_url, 16 if dry else 512) for _ in range(REQUESTS)]
            while not all(future.done() for future in pending) or not scrapes:
                scrapes.append(scrape(server.base_url))
                time.sleep(1.0)
            codes = [future.result() for future in pending]
        checks.record(f"{REQUESTS} concurrent completions", codes == [200] * REQUESTS, f"status codes {set(codes)}")
        configs = [dict(labels) for metric, labels in scrapes[-1] if metric == "vigil_engine_config_info"]
        devices = [config["device"] for config in configs]
        checks.record("vigil_engine_config_info names the device", devices == [args.device], f"{devices}")
        if dry:
            checks.skip("NVML series", "no GPU on a --device cpu dry run")
        else:
            check_gpus(checks, scrapes)
    finally:
        server.stop()
    checks.exit()


if __name__ == "__main__":
    main()
