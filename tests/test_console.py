"""The live console's data: the ring stays bounded, each GPU gets its series, and on a real server the JSON follows
/metrics' guard, holds no text unless asked, and goes away with --disable-console."""

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from telemetry.console import Console
from telemetry.console_ring import SeriesRing
from telemetry.metrics import VigilMetrics
from tests.api_server import APIServer

KEY = "console-test-key"


def test_the_ring_keeps_its_last_rows_in_memory_fixed_at_start():
    ring = SeriesRing(("a", "b"), capacity=5)
    size = ring.nbytes
    for second in range(12):
        ring.append(second, {"a": float(second)})
    seconds, columns = ring.since(-1)
    assert seconds == [7, 8, 9, 10, 11] and columns["a"] == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert columns["b"] == [None] * 5  # never given: NaN in the ring, null in JSON
    assert ring.since(9)[0] == [10, 11]
    assert ring.nbytes == size == 5 * 2 * 8 + 5 * 8


def complete(server: APIServer, headers: dict[str, str] | None = None) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", headers=headers, timeout=60,
                          json={"model": "smollm", "prompt": "The console test says", "max_tokens": 4})
    response.raise_for_status()


@pytest.mark.server
def test_with_an_api_key_the_console_data_answers_401_without_it_and_never_carries_text(smollm_folder):
    server = APIServer(smollm_folder, "--api-key", KEY, "--metrics-require-api-key", "--log-requests").wait_ready(
        {"Authorization": f"Bearer {KEY}"})
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        complete(server, auth)
        assert httpx.get(f"{server.base_url}/console/data.json").status_code == 401
        assert httpx.get(f"{server.base_url}/console/data.json",
                         headers={"Authorization": "Bearer wrong"}).status_code == 401
        # The page and its assets hold no data, and a browser cannot send a key for them.
        page = httpx.get(f"{server.base_url}/console")
        assert page.status_code == 200 and "console.js" in page.text
        data = httpx.get(f"{server.base_url}/console/data.json", headers=auth, timeout=10).json()
        for _ in range(50):
            if data["requests"]:
                break
            data = httpx.get(f"{server.base_url}/console/data.json", headers=auth, timeout=10).json()
        [row] = data["requests"]
        assert row["output_tokens"] == 4 and "output" not in row  # --log-requests, but keys are set
        assert KEY not in httpx.get(f"{server.base_url}/console/data.json", headers=auth).text
    finally:
        server.stop()


@pytest.mark.server
def test_the_console_is_open_as_metrics_is_lists_outputs_under_log_requests_and_disable_console_removes_it(
    smollm_folder,
):
    server = APIServer(smollm_folder, "--log-requests", "--console-requests", "2",
                       "--console-trace-url", "http://traces.test/trace/{trace_id}").wait_ready()
    try:
        for _ in range(3):
            complete(server)
        data = {"requests": []}
        for _ in range(50):
            data = httpx.get(f"{server.base_url}/console/data.json", timeout=10).json()
            if len(data["requests"]) == 2:
                break
        assert len(data["requests"]) == 2 and all(row["output"] for row in data["requests"])  # the last two of 3
        assert data["trace_url"] == "http://traces.test/trace/{trace_id}"
        assert "console: http://" in server.log_path.read_text()
    finally:
        server.stop()
    server = APIServer(smollm_folder, "--disable-console").wait_ready()
    try:
        assert httpx.get(f"{server.base_url}/console").status_code == 404
        assert httpx.get(f"{server.base_url}/console/data.json").status_code == 404
        deadline = time.monotonic() + 10
        while "ready: " not in (log := server.log_path.read_text()):  # a poll of readiness after /readyz's 200
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert "console:" not in log
    finally:
        server.stop()


def test_each_gpu_the_sampler_reports_gets_its_series_and_its_temperature_lines():
    metrics = VigilMetrics("smollm", CollectorRegistry())
    console = Console(metrics, gpu_count=1)
    # What HardwareSampler writes for one GPU (telemetry/hardware.py), a degree past VigilGPUHot's line.
    hot = console.thresholds["rules"]["gpu_temperature_celsius"]["warning"]["value"]
    for gauge, value in ((metrics.gpu_temperature, hot + 1), (metrics.gpu_utilization, 0.5),
                         (metrics.gpu_memory_used, 2.0**30), (metrics.gpu_power, 300.0), (metrics.gpu_throttled, 0)):
        gauge.labels("0", "NVIDIA H200").set(value)
    console.close_second()
    snapshot = console.snapshot(None)
    assert {name: values[-1] for name, values in snapshot["series"].items() if name.startswith("gpu0_")} == {
        "gpu0_temperature": hot + 1, "gpu0_utilization": 0.5, "gpu0_memory_used": 2.0**30, "gpu0_power": 300.0,
        "gpu0_throttled": 0.0}
    [temperature] = [i for i in snapshot["indicators"] if i["name"] == "gpu0_temperature"]
    assert temperature["state"] == "warning" and temperature["alert"] == "VigilGPUHot"
    assert snapshot["ring"]["bytes"] == 3600 * (len(console.fields) + 1) * 8
