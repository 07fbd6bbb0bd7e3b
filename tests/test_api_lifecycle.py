"""On a real socket: SIGTERM drains (503 for new work, in-flight requests finish, exit 0), and an engine
failure fails the requests in flight with one clear 500 and turns liveness and readiness to 503."""

import json
import signal
import threading
import time

import httpx
import pytest

from server.api.app import ENGINE_JOIN_TIMEOUT_S
from tests.api_server import APIServer, metric_samples
from tests.serve_with_switches import HOLD_LOAD_ENV, SLOW_LOAD_ENV
from tests.serve_with_switches import PROGRAM as WITH_SWITCHES

pytestmark = pytest.mark.server

MODEL = "smollm"
SHUTDOWN_TIMEOUT_S = 6.0


def completion(max_tokens: int, stream: bool = False) -> dict:
    return {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.0, "stream": stream}


class Call(threading.Thread):
    """One request in the background; ``events`` holds a stream's data lines."""

    def __init__(self, base_url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base_url, self.body = base_url, body
        self.status: int | None = None
        self.json: dict | None = None
        self.events: list[str] = []
        self.first_event = threading.Event()
        self.start()

    def run(self) -> None:
        with httpx.stream("POST", f"{self.base_url}/v1/completions", json=self.body, timeout=120) as response:
            self.status = response.status_code
            if not self.body["stream"]:
                response.read()
                self.json = response.json()
                return
            for line in response.iter_lines():
                if line:
                    self.events.append(line)
                    self.first_event.set()

    def result(self) -> "Call":
        self.join(120)
        assert not self.is_alive(), "the request never finished"
        return self

    def chunks(self) -> list[dict]:
        assert self.events[-1] == "data: [DONE]", self.events[-3:]
        return [json.loads(e.removeprefix("data: ")) for e in self.events[:-1]]


def wait_admitted(server: APIServer, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while server.engine_state()["num_unfinished"] < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests were admitted"
        time.sleep(0.02)


@pytest.fixture
def draining_server(smollm_folder):
    server = APIServer(smollm_folder, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)).wait_ready()
    yield server
    server.stop()


def test_sigterm_drains_then_exits_zero(draining_server):
    server = draining_server
    short = Call(server.base_url, completion(12))
    short_stream = Call(server.base_url, completion(12, stream=True))
    too_long = Call(server.base_url, completion(1000, stream=True))
    wait_admitted(server, 3)
    too_long.first_event.wait(60)
    signalled = time.monotonic()
    server.terminate()

    # Draining: probes and new work say 503, liveness holds (the process is fine, just leaving).
    ready = httpx.get(f"{server.base_url}/readyz", timeout=10)
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    refused = httpx.post(f"{server.base_url}/v1/completions", json=completion(1), timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert httpx.get(f"{server.base_url}/livez", timeout=10).status_code == 200

    # The requests in flight that can finish in time do, in full.
    assert short.result().status == 200 and short.json["usage"]["completion_tokens"] == 12
    chunks = short_stream.result().chunks()
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # The one that cannot is ended at the shutdown timeout with a clear 503, and the process exits 0.
    error = too_long.result().chunks()[-1]["error"]
    assert error["code"] == "draining" and error["type"] == "server_error"
    assert server.wait_exit(timeout=60) == 0
    assert SHUTDOWN_TIMEOUT_S <= time.monotonic() - signalled < SHUTDOWN_TIMEOUT_S + 30


def test_an_engine_failure_gives_one_clear_500_and_turns_the_probes_to_503(smollm_folder):
    server = APIServer(smollm_folder, program=WITH_SWITCHES).wait_ready()
    try:
        streaming = Call(server.base_url, completion(500, stream=True))
        waiting = Call(server.base_url, completion(500))
        wait_admitted(server, 2)
        assert streaming.first_event.wait(60)
        server.process.send_signal(signal.SIGUSR1)

        assert waiting.result().status == 500
        assert waiting.json["error"]["message"] == "engine error"
        assert waiting.json["error"]["code"] == "engine_error"
        stream_error = streaming.result().chunks()[-1]["error"]
        assert stream_error["message"] == "engine error"
        # The stream's 200 went out before the failure: the error it carried counts on its own, the 500 as an
        # engine error.
        errors = metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
        assert errors[("vigil_request_errors_total", frozenset({"reason": "stream_error"}.items()))] == 1
        assert errors[("vigil_request_errors_total", frozenset({"reason": "engine"}.items()))] == 1
        for probe in ("/livez", "/readyz"):
            response = httpx.get(f"{server.base_url}{probe}", timeout=10)
            assert response.status_code == 503 and response.json()["error"]["code"] == "engine_dead"
        # /readyz's verdict is the one the metrics report.
        after = metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
        assert after[("vigil_engine_phase", frozenset({"model": "smollm", "phase": "dead"}.items()))] == 1
        assert after[("vigil_engine_ready", frozenset({"model": "smollm"}.items()))] == 0
        refused = httpx.post(f"{server.base_url}/v1/completions", json=completion(1), timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_dead"
        server.terminate()
        assert server.wait_exit(timeout=60) == 0
    finally:
        server.stop()


def test_while_the_model_loads_the_probes_and_metrics_answer_and_requests_wait(smollm_folder):
    server = APIServer(smollm_folder, env={HOLD_LOAD_ENV: "1"}, program=WITH_SWITCHES)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.process.poll() is None and time.monotonic() < deadline, server.log_tail()
            try:
                live = httpx.get(f"{server.base_url}/livez", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert live.status_code == 200  # alive: an orchestrator must not restart a server that is loading
        ready = httpx.get(f"{server.base_url}/readyz", timeout=10)
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "loading"
        refused = httpx.post(f"{server.base_url}/v1/completions", json=completion(1), timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
        assert int(refused.headers["retry-after"]) >= 1
        loading = metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
        assert loading[("vigil_engine_phase", frozenset({"model": MODEL, "phase": "loading"}.items()))] == 1
        assert loading[("vigil_engine_ready", frozenset({"model": MODEL}.items()))] == 0

        server.process.send_signal(signal.SIGUSR2)
        server.wait_ready()
        served = httpx.post(f"{server.base_url}/v1/completions", json=completion(2), timeout=60)
        assert served.status_code == 200
        loaded = metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
        assert loaded[("vigil_engine_phase", frozenset({"model": MODEL, "phase": "serving"}.items()))] == 1
        assert loaded[("vigil_engine_phase", frozenset({"model": MODEL, "phase": "loading"}.items()))] == 0
        assert loaded[("vigil_engine_ready", frozenset({"model": MODEL}.items()))] == 1
    finally:
        server.stop()


def test_sigterm_while_the_model_still_loads_exits_zero_without_waiting_for_the_load(smollm_folder):
    """The load outlasts the shutdown's wait for the engine's thread, in C++ all along: the process leaves with
    status 0, not SIGABRT from C++'s exit handlers under that thread."""
    server = APIServer(smollm_folder, env={SLOW_LOAD_ENV: str(ENGINE_JOIN_TIMEOUT_S + 20)}, program=WITH_SWITCHES)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.process.poll() is None and time.monotonic() < deadline, server.log_tail()
            try:
                if httpx.get(f"{server.base_url}/livez", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        server.terminate()
        assert server.wait_exit(timeout=ENGINE_JOIN_TIMEOUT_S + 15) == 0, server.log_tail()
        assert "terminate called" not in server.log_tail()
    finally:
        server.stop()
