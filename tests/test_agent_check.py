"""HAProxy's agent check (server/api/agent_check.py): the weight a replica reports from its batch, KV cache and
queue, and the line a real server answers on its agent port while it loads, serves, is busy, drains and fails."""

import concurrent.futures
import signal
import socket
import time

import httpx
import pytest

from server.api.agent_check import agent_reply, load_weight_percent
from server.bench.local_server import free_port
from server.engine.async_engine import EngineHealth
from tests.api_server import APIServer
from tests.ops_stack import wait_until
from tests.serve_with_switches import HOLD_LOAD_ENV
from tests.serve_with_switches import PROGRAM as WITH_SWITCHES

MAX_NUM_SEQS = 4
# Long enough to keep the batch full while the test reads the agent: at most the tiny model's 512 positions.
LONG_REQUEST = {"model": "smollm", "prompt": "hello", "max_tokens": 480, "ignore_eos": True, "temperature": 1.0}


def health(running: int = 0, waiting: int = 0, free_blocks: int = 100, blocks: int = 100) -> EngineHealth:
    return EngineHealth(
        loading=False, alive=True, error=None, last_step_at=None, step_started_at=None, num_steps=0,
        num_unfinished=running + waiting, num_free_blocks=free_blocks, num_blocks=blocks, num_running=running,
        num_waiting=waiting, max_num_seqs=8,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("state", "weight"),
    [
        (health(), 100),
        (health(running=4), 50),  # half the batch slots taken
        (health(running=4, waiting=1), 25),  # ...and one request queued behind them
        (health(running=2, free_blocks=10), 10),  # the KV cache is the scarcer: 90% used
        (health(running=8, waiting=30, free_blocks=0), 1),  # full: the lowest weight, never 0 (that is a drain)
    ],
)
def test_the_weight_is_the_capacity_left_divided_by_the_queue(state, weight):
    assert load_weight_percent(state) == weight


def test_the_reply_follows_readiness():
    assert agent_reply(None, health(running=4)) == "up ready 50%"
    assert agent_reply("draining", health()) == "drain #draining"
    for problem in ("loading", "engine_dead", "engine_stalled", "canary_timeout"):
        assert agent_reply(problem, health()) == f"down #{problem}"


def ask_agent(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.settimeout(30)
        answer = b""
        while chunk := sock.recv(1024):
            answer += chunk
    assert answer.endswith(b"\n") and answer.count(b"\n") == 1, answer
    return answer.decode().strip()


@pytest.mark.server
def test_a_real_server_answers_down_while_loading_then_its_load_then_drain(tiny_folder):
    agent_port = free_port()
    server = APIServer(
        tiny_folder, "--agent-port", str(agent_port), "--max-num-seqs", str(MAX_NUM_SEQS), "--shutdown-timeout", "60",
        env={HOLD_LOAD_ENV: "1"}, program=WITH_SWITCHES,
    )  # fmt: skip
    pool = concurrent.futures.ThreadPoolExecutor(MAX_NUM_SEQS)
    try:
        loading = wait_until(lambda: _try_agent(agent_port), 60, what="the agent port answers while the model loads")
        assert loading == "down #loading"

        server.process.send_signal(signal.SIGUSR2)  # let the model load
        server.wait_ready()
        # The server's own readiness canary (a one-token request, every few seconds) may be in flight when asked.
        wait_until(lambda: ask_agent(agent_port) == "up ready 100%", 30, interval=0.2,
                   what="the agent reports the whole weight while the server is idle")  # fmt: skip

        longs = [pool.submit(httpx.post, f"{server.base_url}/v1/completions", json=LONG_REQUEST, timeout=300)
                 for _ in range(MAX_NUM_SEQS)]  # fmt: skip
        wait_until(lambda: server.engine_state()["num_unfinished"] == MAX_NUM_SEQS, 30, interval=0.1,
                   what="every long request is in the engine")  # fmt: skip
        busy = ask_agent(agent_port)
        assert busy == "up ready 1%", "a full batch leaves no capacity"
        assert not any(future.done() for future in longs), "the requests ended before the agent was read"

        server.terminate()
        assert ask_agent(agent_port) == "drain #draining"
        assert [future.result().status_code for future in longs] == [200] * MAX_NUM_SEQS, "the drain finishes them"
        assert server.wait_exit() == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        server.stop()


def _try_agent(port: int) -> str | None:
    try:
        return ask_agent(port)
    except OSError:
        time.sleep(0.2)
        return None


@pytest.mark.server
def test_a_failed_engine_answers_down(tiny_folder):
    agent_port = free_port()
    server = APIServer(tiny_folder, "--agent-port", str(agent_port), program=WITH_SWITCHES).wait_ready()
    try:
        server.process.send_signal(signal.SIGUSR1)  # the engine's next step raises
        httpx.post(f"{server.base_url}/v1/completions", json={"model": "smollm", "prompt": "hi", "max_tokens": 2},
                   timeout=60)  # fmt: skip
        reply = wait_until(lambda: (line := ask_agent(agent_port)).startswith("down") and line, 30, interval=0.2,
                           what="the agent reports the dead engine")  # fmt: skip
        assert reply == "down #engine_dead"
    finally:
        server.stop()
