"""Tensor parallelism through the real command line: a server with two ranks serves what one process would, and
exports each rank's step time; a worker killed while the server idles, or in the middle of a request, makes the
server unready (the engine alert's condition) within a bounded time and fails requests instead of hanging; and
torchrun starts the same ranks as the server does."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server import LLM, SamplingParams
from tests.api_server import ROOT, APIServer, metric_samples
from tests.test_api_lifecycle import Call, completion, wait_admitted

pytestmark = pytest.mark.server

MODEL = "smollm"
# Readiness re-proves an idle engine with a canary every 10 s (server/api/readiness.py); a dead rank shows then.
UNREADY_WITHIN_S = 60.0


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux /proc)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def samples(server: APIServer) -> dict:
    return metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)


def wait_engine_dead(server: APIServer) -> dict:
    """/metrics once readiness has said engine_dead; fails after UNREADY_WITHIN_S."""
    deadline = time.monotonic() + UNREADY_WITHIN_S
    while time.monotonic() < deadline:
        ready = httpx.get(f"{server.base_url}/readyz", timeout=30)
        if ready.status_code == 503 and ready.json()["error"]["code"] == "engine_dead":
            return samples(server)
        time.sleep(0.5)
    raise AssertionError(f"still not engine_dead after {UNREADY_WITHIN_S}s:\n{server.log_tail()}")


def assert_dead_and_refusing(server: APIServer) -> None:
    after = wait_engine_dead(server)
    assert after[("vigil_engine_ready", frozenset({"model": MODEL}.items()))] == 0
    assert after[("vigil_engine_phase", frozenset({"model": MODEL, "phase": "dead"}.items()))] == 1
    refused = httpx.post(f"{server.base_url}/v1/completions", json=completion(1), timeout=30)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_dead"
    assert httpx.get(f"{server.base_url}/livez", timeout=10).status_code == 503


@pytest.fixture
def two_ranks(tiny_folder):
    server = APIServer(tiny_folder, "--tensor-parallel-size", "2").wait_ready()
    yield server
    server.stop()


def test_two_ranks_serve_one_process_tokens_and_export_each_rank_step_time(two_ranks, tiny_folder):
    body = {**completion(8), "prompt": "The capital of France is"}
    served = httpx.post(f"{two_ranks.base_url}/v1/completions", json=body, timeout=60)
    assert served.status_code == 200
    expected = LLM(str(tiny_folder), dtype="float32", kv_cache_memory=32 * 2**20).generate(
        body["prompt"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )
    assert served.json()["choices"][0]["text"] == expected[0].outputs[0].text

    found = samples(two_ranks)
    configs = [labels for name, labels in found if name == "vigil_engine_config_info"]
    assert [dict(labels)["tensor_parallel_size"] for labels in configs] == ["2"]
    counts = [found[("vigil_tensor_parallel_rank_step_duration_seconds_count",
                     frozenset({"model": MODEL, "rank": rank}.items()))] for rank in ("0", "1")]
    steps = found[("vigil_engine_step_duration_seconds_count", frozenset({"model": MODEL}.items()))]
    assert counts[0] == counts[1] >= steps > 0


def test_a_worker_killed_while_idle_makes_the_server_unready(two_ranks):
    (worker,) = child_pids(two_ranks.process.pid)
    subprocess.run(["kill", "-9", str(worker)], check=True)
    assert_dead_and_refusing(two_ranks)
    two_ranks.terminate()
    assert two_ranks.wait_exit(timeout=60) == 0


def test_a_worker_killed_mid_request_fails_it_and_the_server_goes_unready(two_ranks):
    streaming = Call(two_ranks.base_url, completion(400, stream=True))
    wait_admitted(two_ranks, 1)
    assert streaming.first_event.wait(60)
    (worker,) = child_pids(two_ranks.process.pid)
    subprocess.run(["kill", "-9", str(worker)], check=True)
    assert streaming.result().chunks()[-1]["error"]["message"] == "engine error"
    assert_dead_and_refusing(two_ranks)


def test_the_workers_end_with_the_server(tiny_folder):
    server = APIServer(tiny_folder, "--tensor-parallel-size", "2").wait_ready()
    (worker,) = child_pids(server.process.pid)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{worker}").exists() and Path(f"/proc/{worker}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the worker outlived its server"
        time.sleep(0.1)
    server.stop()


def test_torchrun_starts_the_ranks_and_generates_what_one_process_does(tiny_folder):
    args = ["generate", "--model", str(tiny_folder), "--dtype", "float32", "--kv-cache-memory", "32MiB",
            "--max-tokens", "8", "The capital of France is"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    one = subprocess.run([sys.executable, "-m", "server", *args], capture_output=True, text=True, timeout=300,
                         check=True, env=env, cwd=ROOT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "server"]
    two = subprocess.run([*torchrun, *args, "--tensor-parallel-size", "2"], capture_output=True, text=True,
                         timeout=300, check=True, env=env, cwd=ROOT)
    assert "tensor parallel size: 2" in two.stderr
    assert two.stdout == one.stdout and "The capital of France is" in one.stdout
