"""Chaos: faults played against a fleet on 127.0.0.1 (tests/chaos/stack.py): two real replicas behind the real
HAProxy (deploy/haproxy/haproxy.cfg), watched by the real Prometheus with the project's rules, paging through the
real Alertmanager into the alert inbox. Every request is accounted for: answered, or failed with an error the
client sees at once; none is lost silently or left hanging. Each scenario prints its row of the table.

- A replica killed outright (SIGKILL) under load: requests it had not answered are retried by HAProxy
  (retry-on conn-failure empty-response) and answered; the streams it had begun end with an error at once.
  VigilServerDown for it reaches the inbox within its `for:` and a few evaluations.
- A replica's engine thread dies while its HTTP loop lives: /livez and its agent check say so, HAProxy takes it out
  of the rotation, the requests it was running end in a clean 500, later ones are answered by the other
  replica, VigilNotReady pages for it, and nothing else pages.
- Prometheus stopped: serving goes on, and the heartbeat stops reaching its receiver, which is the signal.
- The KV pool filled by long generations: requests are preempted and recomputed, none fails, the KV-pressure and
  preemption warnings reach the inbox, nothing pages, and the KV warning resolves once the load is gone.
- Readers that stall (a long stream asked for and never read): everyone else is served as before, within a
  stated bound, and the stalled requests end and free their blocks.
- A rolling restart under load (rollout.py's restart): every request and stream answered, nothing pages.

The whole table prints at the end of the run (tests/chaos/conftest.py).
"""

import json
import signal
import socket
import statistics
import time

import httpx
import pytest

from deploy.haproxy.rollout import restart
from tests.chaos.stack import ChaosStack, StreamOutcomes, print_row
from tests.fleet import ClientLoop
from tests.ops_stack import wait_until
from tests.serve_with_switches import PROGRAM as FAULT_SWITCH_PROGRAM

pytestmark = [pytest.mark.e2e, pytest.mark.server]

FOR_S = 3  # the `for:` of the alerts a scenario expects, shrunk from minutes
# For plus the scrape that sees the fault, two evaluations, Alertmanager's grouping (1 s) and a margin.
PAGE_WITHIN_S = FOR_S + 12
SERVED_AFTER = 20
FAULT_SIGNAL = signal.SIGUSR1  # tests/serve_with_switches.py: the engine's next step raises
HEARTBEAT_SILENCE_S = 10.0  # five heartbeats missed


def test_a_replica_killed_under_load_loses_no_request_and_pages(tmp_path, tiny_folder):
    with ChaosStack(tmp_path, tiny_folder, {"VigilServerDown": f"{FOR_S}s"}) as stack:
        victim = stack.replicas["vigil-1"]
        # Streams first, so that one is surely on the victim when it dies; then short requests beside them.
        with StreamOutcomes(stack.haproxy.url) as streams:
            wait_until(lambda: victim.server.engine_state()["num_unfinished"] >= 1, 60, interval=0.05,
                       what="a stream runs on the victim")  # fmt: skip
            with ClientLoop(stack.haproxy.url, clients=4, max_tokens=24, max_seconds=240) as loop:
                wait_until(lambda: stack.haproxy.api.server("blue", victim.name).sessions >= 2, 60, interval=0.02,
                           what="short requests in flight on the victim beside its stream")  # fmt: skip
                victim.server.process.kill()  # SIGKILL: no drain, no goodbye
                killed_at = time.monotonic()
                victim.server.process.wait()
                sent = loop.sent
                wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served by vigil-2 alone")
                page = stack.wait_for_page("VigilServerDown", PAGE_WITHIN_S + 30)
                paged_after_s = time.monotonic() - killed_at
        print_row("replica killed (SIGKILL) under load", loop, streams, "VigilServerDown", stack.pages(), paged_after_s)
        assert loop.failures == [], loop.failures[:5]  # not-yet-answered requests were retried and answered
        assert streams.hung == 0, "a stream hung"
        assert streams.outcomes["failed with an error"] >= 1, "the victim's stream must have ended in an error"
        assert streams.slowest_error_s < streams.timeout_s
        assert page["labels"]["instance"] == victim.address
        assert paged_after_s <= PAGE_WITHIN_S, paged_after_s
        assert stack.pages() == [("VigilServerDown", victim.address)]


def test_a_replica_whose_engine_dies_is_taken_out_of_rotation_and_pages_as_not_ready(tmp_path, tiny_folder):
    with ChaosStack(tmp_path, tiny_folder, {"VigilNotReady": f"{FOR_S}s"}, program=FAULT_SWITCH_PROGRAM) as stack:
        victim = stack.replicas["vigil-1"]
        with ClientLoop(stack.haproxy.url, clients=4, max_tokens=24, max_seconds=240) as loop:
            wait_until(lambda: stack.haproxy.api.server("blue", victim.name).sessions >= 1, 60, interval=0.02,
                       what="requests in flight on the victim")  # fmt: skip
            victim.server.process.send_signal(FAULT_SIGNAL)  # its engine's next step raises; HTTP lives on
            failed_at = time.monotonic()
            wait_until(lambda: not stack.haproxy.api.server("blue", victim.name).up, 30, interval=0.1,
                       what="HAProxy takes the victim out of the rotation")  # fmt: skip
            out_after_s = time.monotonic() - failed_at
            sent = loop.sent
            wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served by vigil-2 alone")
            page = stack.wait_for_page("VigilNotReady", PAGE_WITHIN_S + 30)
            paged_after_s = time.monotonic() - failed_at
        print_row("engine thread dead, HTTP loop alive", loop, None, "VigilNotReady", stack.pages(), paged_after_s)
        live = httpx.get(f"{victim.server.base_url}/livez", timeout=10)
        assert live.status_code == 503 and live.json()["error"]["code"] == "engine_dead"
        # Only the requests running on the victim when its engine died fail, each with a clean 500.
        assert all(failure.startswith("500:") and "engine_error" in failure for failure in loop.failures), \
            loop.failures[:5]  # fmt: skip
        assert len(loop.failures) <= 4
        assert out_after_s < 10, out_after_s
        assert page["labels"]["instance"] == victim.address
        assert paged_after_s <= PAGE_WITHIN_S, paged_after_s
        assert stack.pages() == [("VigilNotReady", victim.address)], "nothing else pages"



def test_prometheus_stopped_stops_the_heartbeat_which_is_the_signal(tmp_path, tiny_folder):
    """No alert can say that the alerting itself is down: the heartbeat (VigilWatchdog, every 2 s here) stopping at
    its receiver is the signal, which a dead man's switch outside the stack turns into a page."""
    with ChaosStack(tmp_path, tiny_folder, {}) as stack:
        with ClientLoop(stack.haproxy.url, clients=2, max_tokens=16, max_seconds=120) as loop:
            beating = wait_until(lambda: (beat := stack.inbox.heartbeat())["count"] >= 2 and beat, 60,
                                 what="heartbeats reach the inbox")  # fmt: skip
            stack.prometheus.stop()
            stopped_at = time.monotonic()
            last = wait_until(lambda: (beat := stack.inbox.heartbeat())["seconds_ago"] > HEARTBEAT_SILENCE_S and beat,
                              90, interval=0.5, what="the heartbeat stops")  # fmt: skip
            silent_after_s = time.monotonic() - stopped_at - last["seconds_ago"]
            sent = loop.sent
            wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 60, what="serving goes on without monitoring")
        print_row("Prometheus stopped", loop, None, "the heartbeat stops", stack.pages(), silent_after_s)
        assert last["count"] >= beating["count"]
        assert loop.failures == [], loop.failures[:5]
        assert stack.pages() == [], "nothing can page with Prometheus down"


# 48 blocks of 16 tokens (16 KiB each for the tiny model's fp16 cache): a few long generations fill it.
SMALL_KV_POOL = ("--kv-cache-memory", "768KiB")
KV_WARNINGS = ("VigilKVCacheHighUsage", "VigilPreemptionsSustained")


def test_a_kv_pool_filled_by_long_generations_preempts_fails_nothing_and_warns_until_it_drains(tmp_path, tiny_folder):
    fast = dict.fromkeys(KV_WARNINGS, f"{FOR_S}s")
    with ChaosStack(tmp_path, tiny_folder, fast, replica_args=SMALL_KV_POOL) as stack:
        loaded_at = time.monotonic()
        with ClientLoop(stack.haproxy.url, clients=8, max_tokens=400, ignore_eos=True, max_seconds=240) as loop:
            warning = wait_until(lambda: stack.inbox.alerts("VigilKVCacheHighUsage", "firing"), PAGE_WITHIN_S + 60,
                                 interval=0.2, what="the KV-pressure warning in the inbox")[0]  # fmt: skip
            warned_after_s = time.monotonic() - loaded_at
            preempted = wait_until(lambda: stack.inbox.alerts("VigilPreemptionsSustained", "firing"), 60,
                                   interval=0.2, what="the preemption warning in the inbox")  # fmt: skip
        drained = wait_until(  # the rule reads each minute's peak: it resolves a minute after the load
            lambda: stack.inbox.alerts("VigilKVCacheHighUsage", "resolved"), 100, interval=0.2,
            what="the KV-pressure warning resolved once the load is gone")  # fmt: skip
        print_row("KV pool exhausted by long generations", loop, None, ", ".join(KV_WARNINGS),
                  stack.pages("warning"), warned_after_s)  # fmt: skip
        assert loop.sent > 0 and loop.failures == [], loop.failures[:5]  # preempted and recomputed, never refused
        assert warning["labels"]["instance"] in {replica.address for replica in stack.replicas.values()}
        assert preempted and drained
        assert stack.pages() == [], "a burst of KV pressure is a ticket, not a page"


STALLED_READERS = 16
STALL_BOUND = 3.0  # another client's median latency with the stalled readers, at most this times without, plus 1 s


def test_readers_that_stall_hold_no_other_client_back(tmp_path, tiny_folder):
    """Clients that open a long stream and never read it: HAProxy and the server buffer what they can and stop
    writing to them, the engine finishes their requests anyway, and everyone else is served as before."""
    with ChaosStack(tmp_path, tiny_folder, {}) as stack:
        before = timed_completions(stack.haproxy.url, 12)
        stalled = [stalled_reader(stack.haproxy.url) for _ in range(STALLED_READERS)]
        try:
            wait_until(lambda: sum(replica.server.engine_state()["num_unfinished"] for replica in
                                   stack.replicas.values()) >= 4, 30, interval=0.05,
                       what="the stalled readers' requests run")  # fmt: skip
            with ClientLoop(stack.haproxy.url, clients=2, max_tokens=16, max_seconds=120) as loop:
                during = timed_completions(stack.haproxy.url, 12)
        finally:
            for sock in stalled:
                sock.close()
        print_row(f"{STALLED_READERS} readers that stall", loop, None, "none", stack.pages(), None)
        print(f"another client's median latency: {statistics.median(before) * 1000:.0f} ms without the stalled "
              f"readers, {statistics.median(during) * 1000:.0f} ms with them")
        assert loop.failures == [], loop.failures[:5]
        assert statistics.median(during) <= STALL_BOUND * statistics.median(before) + 1.0
        for replica in stack.replicas.values():
            replica.server.wait_all_blocks_free(timeout=60)  # their requests end; nothing is held
        assert stack.pages() == []


def timed_completions(url: str, count: int) -> list[float]:
    seconds = []
    body = {"model": "smollm", "prompt": "Hello", "max_tokens": 8, "temperature": 0.0}
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            started = time.monotonic()
            assert client.post(f"{url}/v1/completions", json=body).status_code == 200
            seconds.append(time.monotonic() - started)
    return seconds


def stalled_reader(url: str) -> socket.socket:
    """A connection that asks for a long stream, with a receive buffer of 1 KiB, and never reads a byte."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((host, int(port)))
    body = json.dumps({"model": "smollm", "prompt": "Once", "max_tokens": 480, "ignore_eos": True,
                       "temperature": 1.0, "stream": True}).encode()  # fmt: skip
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
    return sock


def test_a_rolling_restart_under_load_fails_no_request_and_pages_nothing(tmp_path, tiny_folder):
    """deploy/haproxy/rollout.py's restart, as an operator runs it: each replica drained, replaced and let back in
    turn while clients send requests and streams. A planned restart is not an incident: nothing pages."""
    with ChaosStack(tmp_path, tiny_folder, {}) as stack:
        generations = {name: replica.generation for name, replica in stack.replicas.items()}
        steps: list[str] = []
        with StreamOutcomes(stack.haproxy.url) as streams, \
                ClientLoop(stack.haproxy.url, clients=3, max_tokens=24, max_seconds=300) as loop:  # fmt: skip
            wait_until(lambda: loop.sent >= SERVED_AFTER, 60, what="the loop is served before the rollout")
            restart(stack.haproxy.api, "blue", lambda name: stack.replicas[name].replace(), 120.0, 120.0,
                    steps.append)  # fmt: skip
            sent = loop.sent
            wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served after the rollout")
        print_row("rolling restart under load", loop, streams, "none", stack.pages(), None)
        assert loop.failures == [], loop.failures[:5]
        assert streams.hung == 0 and streams.outcomes["failed with an error"] == 0, streams.outcomes
        assert {name: replica.generation for name, replica in stack.replicas.items()} == {
            name: generation + 1 for name, generation in generations.items()}
        assert stack.pages() == []
