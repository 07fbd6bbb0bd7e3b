"""Telemetry against a live server on 127.0.0.1: every number checked against what was actually sent."""

import concurrent.futures
import time

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from kernels.cpu_variants import chosen_variant
from server.allocator import jemalloc_library
from server.engine.flops import ModelFlops
from server.engine.kv_pool import kv_bytes_per_block
from server.models.config import ModelConfig
from tests.api_server import APIServer

pytestmark = pytest.mark.server

KEY = "sk-telemetry-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEMPERATURES = [0.0, 0.0, 0.3, 0.7, 0.7, 1.0, 1.3, 1.9]


@pytest.fixture(scope="module")
def server(smollm_folder):
    server = APIServer(
        smollm_folder, "--api-key", KEY, "--metrics-require-api-key", "--max-request-bytes", "65536"
    ).wait_ready(AUTH)
    yield server
    server.stop()


def scrape(server: APIServer) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{server.base_url}/metrics", headers=AUTH, timeout=10).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def complete(server: APIServer, temperature: float, max_tokens: int) -> dict:
    body = {"model": "smollm", "prompt": f"Count slowly from one, at temperature {temperature}:",
            "max_tokens": max_tokens, "temperature": temperature, "seed": 1}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=120)
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def traffic(server):
    """A known mix: eight completions at once, then bad requests of four kinds."""
    before = scrape(server)
    with concurrent.futures.ThreadPoolExecutor(len(TEMPERATURES)) as pool:
        results = list(pool.map(lambda t: complete(server, t[1], 6 + t[0]), enumerate(TEMPERATURES)))
    bad = {
        "validation": [{"model": "smollm", "prompt": "x", "temperature": -1}, {"model": "smollm", "prompt": ""},
                       {"model": "smollm", "prompt": "x", "max_tokens": 0}],
        "unauthorized": [None, None],
        "payload_too_large": ["x" * 70_000],
    }
    for reason, bodies in bad.items():
        for body in bodies:
            if reason == "unauthorized":
                response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "hi"},
                                      headers={"Authorization": "Bearer wrong"}, timeout=30)
            elif reason == "payload_too_large":
                response = httpx.post(f"{server.base_url}/v1/completions", content=body.encode(),
                                      headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
            else:
                response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=30)
            assert 400 <= response.status_code < 500, response.text
    server.wait_all_blocks_free(headers=AUTH)
    return before, scrape(server), results, {k: len(v) for k, v in bad.items()}


def rise(traffic, name: str, **labels: str) -> float:
    before, after, _, _ = traffic
    return value(after, name, **labels) - value(before, name, **labels)


def test_generation_tokens_equal_the_completion_tokens_returned(traffic):
    results = traffic[2]
    assert rise(traffic, "vigil_generation_tokens_total", model="smollm") == sum(
        r["usage"]["completion_tokens"] for r in results
    )
    assert rise(traffic, "vigil_prompt_tokens_total", model="smollm") == sum(
        r["usage"]["prompt_tokens"] for r in results
    )


def test_queue_time_and_ttft_counts_equal_the_number_of_requests(traffic):
    for histogram in ("vigil_request_queue_time_seconds", "vigil_time_to_first_token_seconds",
                      "vigil_request_duration_seconds"):
        assert rise(traffic, f"{histogram}_count", model="smollm") == len(TEMPERATURES), histogram


def test_the_temperature_histogram_holds_exactly_the_temperatures_sent(traffic):
    assert rise(traffic, "vigil_request_temperature_count", model="smollm") == len(TEMPERATURES)
    assert rise(traffic, "vigil_request_temperature_sum", model="smollm") == pytest.approx(sum(TEMPERATURES))
    for bound in ("0.0", "0.3", "0.7", "1.0", "1.5", "2.0"):
        expected = sum(t <= float(bound) for t in TEMPERATURES)
        assert rise(traffic, "vigil_request_temperature_bucket", model="smollm", le=bound) == expected, bound


def test_error_counters_rise_by_the_bad_requests_of_each_kind(traffic):
    for reason, count in traffic[3].items():
        assert rise(traffic, "vigil_request_errors_total", reason=reason) == count, reason
    for reason in ("rate_limited", "queue_full", "engine", "not_ready"):
        assert rise(traffic, "vigil_request_errors_total", reason=reason) == 0, reason
    assert rise(traffic, "vigil_http_requests_total", route="/v1/completions", code="200") == len(TEMPERATURES)
    assert rise(traffic, "vigil_http_requests_total", route="/v1/completions", code="401") == 2


def test_concurrency_shows_batches_larger_than_one(traffic):
    total = rise(traffic, "vigil_batch_size_count", model="smollm")
    singles = rise(traffic, "vigil_batch_size_bucket", model="smollm", le="1.0")
    assert total > singles


def test_infrastructure_gauges_on_a_gpu_less_machine(traffic, smollm_folder):
    after = traffic[1]
    assert value(after, "vigil_gpu_count") == 0
    assert value(after, "vigil_host_memory_total_bytes") > value(after, "vigil_host_memory_used_bytes") > 0
    per_block = kv_bytes_per_block(ModelConfig.from_folder(smollm_folder), 16, torch.float16)
    num_blocks = 256 * 2**20 // per_block  # the server runs with --kv-cache-memory 256MiB, an fp16 cache
    assert value(after, "vigil_kv_cache_memory_bytes", model="smollm") == num_blocks * per_block
    config = {"block_size": "16", "num_blocks": str(num_blocks), "cache_dtype": "float16", "device": "cpu"}
    assert value(after, "vigil_kv_cache_config_info", model="smollm", **config) == 1
    assert value(after, "vigil_engine_ready", model="smollm") == 1
    assert value(after, "vigil_engine_phase", model="smollm", phase="serving") == 1
    # The server's flags ask for float32 on the CPU, where the C++ kernels serve (when a compiler is there).
    # Its execution plan: every decode step's layers in one compiled call, over fbgemm's fp16 weights.
    engine = {"attention_backend": "cpu", "dtype": "float32", "weight_dtype": "float16", "quantization": "none",
              "device": "cpu", "tensor_parallel_size": "1", "cpu_kernels": chosen_variant().name,
              "decode_path": "one-call",
              "linear_kernels": "qkv=fbgemm-fp16,o_proj=fbgemm-fp16,gate_up=fbgemm-fp16,down=fbgemm-fp16,"
                                "lm_head=fbgemm-fp16 in 12 slices",
              "allocator": "jemalloc" if jemalloc_library() else "system"}
    assert value(after, "vigil_engine_config_info", model="smollm", **engine) == 1
    assert value(after, "process_resident_memory_bytes") > 0


def test_metrics_need_the_key_when_keys_are_set(server):
    assert httpx.get(f"{server.base_url}/metrics", timeout=10).status_code == 401


def test_openmetrics_exposition_carries_no_exemplars_without_tracing(server):
    response = httpx.get(f"{server.base_url}/metrics", timeout=10,
                         headers={**AUTH, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")
    assert "trace_id" not in response.text


def test_idle_canaries_keep_the_engine_proven_but_out_of_the_served_token_counters(server, traffic):
    """With no client request and no probe, the status reporter still proves the engine with a canary every
    CANARY_INTERVAL_S; its tokens are work, not service."""
    from server.api.readiness import CANARY_INTERVAL_S, STATUS_REPORT_INTERVAL_S

    before = scrape(server)
    steps = value(before, "vigil_engine_step_duration_seconds_count", model="smollm")
    deadline = time.monotonic() + CANARY_INTERVAL_S + 4 * STATUS_REPORT_INTERVAL_S + 10
    while (after := scrape(server)) and value(after, "vigil_engine_step_duration_seconds_count",
                                              model="smollm") == steps:
        assert time.monotonic() < deadline, "no canary ran on the idle server"
        time.sleep(0.25)
    for counter, labels in (("vigil_generation_tokens_total", {}), ("vigil_prompt_tokens_total", {}),
                            ("vigil_request_finished_total", {"finish_reason": "length"})):
        assert value(after, counter, model="smollm", **labels) == value(before, counter, model="smollm", **labels)
    assert value(after, "vigil_model_flops_total", model="smollm") > value(before, "vigil_model_flops_total",
                                                                            model="smollm")
    assert value(after, "vigil_engine_ready", model="smollm") == 1


def test_model_flops_count_every_token_of_the_requests_sent(traffic, smollm_folder):
    """Each request computes prompt + completion - 1 tokens, token i seeing i + 1 keys; readiness canaries
    (one prompt token, one output token) may add their own, whole."""
    flops = ModelFlops.of(ModelConfig.from_folder(smollm_folder))
    expected = 0
    for result in traffic[2]:
        usage = result["usage"]
        computed = usage["prompt_tokens"] + usage["completion_tokens"] - 1
        expected += computed * flops.per_token + computed * (computed + 1) // 2 * flops.per_attended_key
        expected += usage["completion_tokens"] * flops.per_sampled_token
    canary = flops.per_token + flops.per_attended_key + flops.per_sampled_token
    extra = rise(traffic, "vigil_model_flops_total", model="smollm") - expected
    assert extra >= 0 and extra % canary == 0, extra
    after = traffic[1]
    assert value(after, "vigil_matmul_peak_flops_per_second", model="smollm") > 1e9
    assert 0 <= value(after, "vigil_kv_cache_waste_ratio", model="smollm") < 1
