"""Several models in one real server (a model config file, two tiny models of different families, each its own
engine): /v1/models lists both, a request's `model` picks its engine and comes back in the response, an unknown name
is a 404 that lists the served names, `auto` routes simple requests to the small model and hard ones to the large
one until the large one's queue is long, and every series keeps its model label in one /metrics."""

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server.bench.local_server import LocalServer
from tests.api_server import READY_TIMEOUT_S, ROOT, metric_samples
from tests.tiny_families import FAMILIES, write_hf_checkpoint

pytestmark = pytest.mark.server

OVERFLOW_WAITING = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_folder, smollm_folder):
    root = tmp_path_factory.mktemp("multi-model")
    large = write_hf_checkpoint(FAMILIES["qwen3"], root / "qwen3", smollm_folder)
    config = root / "models.toml"
    config.write_text(f"""
[[model]]
name = "small"
model = "{tiny_folder}"
kv_cache_memory = "64MiB"

[[model]]
name = "large"
model = "{large}"
kv_cache_memory = "96MiB"
max_num_seqs = 1

[[alias]]
name = "auto"
policy = "small_first"
small = "small"
large = "large"
max_small_tokens = 32
hard_patterns = ["prove"]
overflow_waiting = {OVERFLOW_WAITING}
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    started = LocalServer(("--model-config", str(config), "--dtype", "float32"), root / "server.log", env=env)
    yield started.wait_ready(READY_TIMEOUT_S)
    started.stop()


def complete(server: LocalServer, model: str, prompt: str = "Hello", max_tokens: int = 4) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                      json={"model": model, "prompt": prompt, "max_tokens": max_tokens})


def metrics(server: LocalServer) -> dict:
    return metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_v1_models_lists_every_served_model(server):
    listed = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"]
    assert [card["id"] for card in listed] == ["small", "large"]
    assert httpx.get(f"{server.base_url}/v1/models/large", timeout=10).json()["id"] == "large"


def test_the_model_named_serves_the_request_and_keeps_its_metrics_apart(server):
    before = metrics(server)
    for model in ("small", "large", "large"):
        response = complete(server, model)
        assert response.status_code == 200 and response.json()["model"] == model
    chat = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": "large", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert chat.json()["model"] == "large"
    after = metrics(server)

    def finished(model: str) -> float:
        name, labels = "vigil_request_finished_total", {"model": model, "finish_reason": "length"}
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert (finished("small"), finished("large")) == (1, 3)
    for model, size in (("small", 64 * 2**20), ("large", 96 * 2**20)):
        assert sample(after, "vigil_kv_cache_memory_bytes", model=model) == size
        assert sample(after, "vigil_engine_ready", model=model) == 1


def test_an_unknown_model_is_a_404_that_lists_the_served_names(server):
    response = complete(server, "gpt-4")
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "`small`, `large`, `auto`" in error["message"]
    tokenize = httpx.post(f"{server.base_url}/tokenize", json={"model": "gpt-4", "prompt": "x"}, timeout=10)
    assert tokenize.status_code == 404


def test_auto_sends_simple_requests_to_the_small_model_and_hard_ones_to_the_large(server):
    before = metrics(server)
    assert complete(server, "auto", "Hello there").json()["model"] == "small"
    assert complete(server, "auto", "Please prove it").json()["model"] == "large"
    assert complete(server, "auto", "Hello", max_tokens=33).json()["model"] == "large"
    after = metrics(server)
    for model, reason in (("small", "simple"), ("large", "hard_rule"), ("large", "long_output")):
        labels = {"alias": "auto", "model": model, "reason": reason}
        name = "vigil_router_decisions_total"
        assert sample(after, name, **labels) - sample(before, name, **labels) == 1


def test_a_long_queue_on_the_large_model_overflows_hard_requests_to_the_small_one(server):
    """The large model runs one sequence at a time; long generations queue behind it."""
    streams = [threading.Thread(target=complete, args=(server, "large", "Hello", 400)) for _ in range(5)]
    for stream in streams:
        stream.start()
    deadline = time.monotonic() + 60
    while sample(metrics(server), "vigil_num_requests_waiting", model="large") < OVERFLOW_WAITING:
        assert time.monotonic() < deadline, "the large model's queue never grew"
        time.sleep(0.05)
    overflowed = complete(server, "auto", "Please prove it")
    for stream in streams:
        stream.join()
    assert overflowed.json()["model"] == "small"
    labels = {"alias": "auto", "model": "small", "reason": "overflow"}
    assert sample(metrics(server), "vigil_router_decisions_total", **labels) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/m/a", "--served-model-name", "a", "--served-model-name", "b"], "2 --served-model-name for 1"),
        (["--model", "/m/a", "--model-config", "/nonexistent.toml"], "not both"),
    ],
)
def test_flags_that_do_not_fit_exit_2_with_one_line(argv, message):
    result = subprocess.run([sys.executable, "-m", "server", "serve", *argv], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "vigil serve: error: " in result.stderr and message in result.stderr


def test_an_alias_that_routes_to_no_served_model_exits_2(tmp_path, tiny_folder):
    config = tmp_path / "models.toml"
    config.write_text(f'[[model]]\nname = "a"\nmodel = "{tiny_folder}"\n'
                      '[[alias]]\nname = "auto"\nsmall = "a"\nlarge = "b"\n')
    result = subprocess.run([sys.executable, "-m", "server", "serve", "--model-config", str(config)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2 and "routes to b, which is not served" in result.stderr
