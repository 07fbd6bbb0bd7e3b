"""``bench serve`` against Vigil and against transformers' own server, in the same run (step 4 of
gpu_check/gpu_check.sh).

    python -m gpu_check.serve_gpu                 # CUDA, bf16: 256 prompts of 128 tokens, 128 out, 64 at a time
    python -m gpu_check.serve_gpu --device cpu    # dry run: fp32, 8 prompts of 16 tokens, 8 out, 4 at a time

Starts ``python -m server serve`` (A) and ``transformers serve --continuous-batching`` (B) on the bundled model,
each with part of the GPU's memory, then ``python -m server bench serve --compare`` streams the same workload to
both, alternating. Checks: Vigil completes every request; transformers completes some (its figures are the
comparison, not a verdict). The result JSON and both servers' logs go to ``--out``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpu_check.checks import Checks
from server.bench.local_server import LocalServer, free_port
from server.models.loader import resolve_model_folder

READY_TIMEOUT_S = 300.0


def start_transformers(folder: Path, device: str, dtype: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    # transformers' console script, installed beside this Python.
    command = [str(Path(sys.executable).with_name("transformers")), "serve", str(folder), "--continuous-batching",
               "--device", device, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port)]
    # Its KV cache takes this share of the free memory, 0.6-0.9 unless told: on a CPU dry run beside Vigil's server
    # and the tests that much was OOM-killed mid-request, while 8 short requests need a few MiB.
    command += ["--cb-max-memory-percent", "0.3" if device != "cpu" else "0.05"]
    # Its /v1/models scans the Hugging Face hub cache and answers 500 where that folder does not exist (a machine
    # that never downloaded a model): an empty one of its own serves.
    hub_cache = tempfile.mkdtemp(prefix="hf-hub-")
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                               env={**os.environ, "HF_HUB_CACHE": hub_cache})
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    status = None
    while time.monotonic() < deadline and process.poll() is None:
        try:
            status = httpx.get(f"{base_url}/v1/models", timeout=5).status_code
        except httpx.TransportError:
            status = None
        if status == 200:
            return process, base_url
        if status is not None and status >= 500:
            break
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"transformers serve did not come up (last /v1/models status {status}); see {log}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    dry = args.device == "cpu"
    dtype = "float32" if dry else "bfloat16"
    prompts, input_len, output_len, concurrency = (8, 16, 8, 4) if dry else (256, 128, 128, 64)
    args.out.mkdir(parents=True, exist_ok=True)
    checks = Checks()
    folder = resolve_model_folder(None)
    vigil = LocalServer(["--device", args.device, "--dtype", dtype, "--served-model-name", "vigil",
                         "--gpu-memory-utilization", "0.4"], args.out / "serve-vigil.log")
    transformers = None
    try:
        vigil.wait_ready(READY_TIMEOUT_S)
        transformers, hf_url = start_transformers(folder, args.device, dtype, args.out / "serve-transformers.log")
        result = args.out / "serve-vigil-vs-transformers.json"
        bench = subprocess.run(
            [sys.executable, "-m", "server", "bench", "serve", "--base-url", vigil.base_url, "--compare", hf_url,
             # its /v1/models may list nothing (the hub cache it scans is empty): the folder names the model it serves
             "--compare-model", str(folder),
             "--num-prompts", str(prompts), "--input-len", str(input_len), "--output-len", str(output_len),
             "--max-concurrency", str(concurrency), "--request-rate", "inf",
             # transformers serve refuses ignore_eos (422), so only Vigil's requests carry it: B's outputs may
             # end early at an EOS, and the comparison is in output tokens per second, not requests.
             "--extra-body", '{"ignore_eos": true}',
             "--result-json", str(result)],
            check=False,
        )
        checks.record("bench serve ran", bench.returncode == 0, f"exit status {bench.returncode}")
        if result.exists():
            summaries = {label: side["summary"] for label, side in json.loads(result.read_text())["results"].items()}
            a, b = summaries["A"], summaries.get("B", {"completed": 0, "output_throughput": 0.0})
            checks.record(f"Vigil completed all {prompts} requests", a["completed"] == prompts and not a["failed"],
                          f"{a['completed']} done, {a['failed']} failed, {a['output_throughput']:.0f} output tok/s")
            checks.record("transformers serve answered", b["completed"] > 0,
                          f"{b['completed']} done, {b['output_throughput']:.0f} output tok/s")
    finally:
        vigil.stop()
        if transformers is not None:
            transformers.terminate()
            transformers.wait(60)
    checks.exit()


if __name__ == "__main__":
    main()
