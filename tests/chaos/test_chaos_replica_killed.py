"""Chaos: a replica killed outright (SIGKILL) under load, behind the real HAProxy (deploy/haproxy/haproxy.cfg),
watched by the real Prometheus with the project's rules, paging through the real Alertmanager into the alert
inbox. Every request is accounted for: answered, or failed with an error the client sees at once; none is lost
silently or left hanging. Requests not yet answered by the killed replica are retried by HAProxy (retry-on
conn-failure empty-response) and succeed; streams it had begun end with an error. VigilServerDown for it reaches
the inbox within its `for:` and a few evaluations. A table of what was sent and seen is printed at the end.
"""

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import pytest

from server.bench.local_server import free_port
from tests.fleet import ClientLoop, HAProxy, Replica
from tests.ops_stack import (
    ROOT,
    AlertInbox,
    Alertmanager,
    Prometheus,
    alertmanager_config,
    prometheus_config,
    rewrite_rules,
    wait_until,
    write_targets,
)

pytestmark = [pytest.mark.e2e, pytest.mark.server]

REPLICAS = ("vigil-1", "vigil-2")
REPLICA_ARGS = ("--max-num-seqs", "8")
PAGE = "VigilServerDown"
PAGE_FOR_S = 3
# For plus the scrape that sees the target down, two evaluations and Alertmanager's grouping (1 s) and a margin.
PAGE_WITHIN_S = PAGE_FOR_S + 12
STREAMS = 3
STREAM_TOKENS = 480  # up to the tiny model's 512 positions: a stream outlives the wait before the kill
CLEAN_ERROR_WITHIN_S = 30.0
SERVED_AFTER = 20


@dataclass
class StreamOutcomes:
    """Streaming clients, each sending one long stream after another: how each stream ended."""

    url: str
    outcomes: Counter = field(default_factory=Counter)
    slowest_error_s: float = 0.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(STREAMS)]

    def _run(self) -> None:
        body = {"model": "smollm", "prompt": "Once", "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                "temperature": 1.0, "stream": True}
        while not self._stop.is_set():
            last_event = time.monotonic()
            try:
                with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=CLEAN_ERROR_WITHIN_S) as r:
                    done = False
                    for line in r.iter_lines():
                        last_event = time.monotonic()
                        done = done or line == "data: [DONE]"
                        if '"error"' in line:
                            break
                outcome = "answered" if r.status_code == 200 and done else "failed with an error"
            except httpx.HTTPError:
                outcome = "failed with an error"
            if outcome != "answered":
                self.slowest_error_s = max(self.slowest_error_s, time.monotonic() - last_event)
            self.outcomes[outcome] += 1

    def __enter__(self) -> "StreamOutcomes":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2 * CLEAN_ERROR_WITHIN_S)
        self.hung = sum(thread.is_alive() for thread in self._threads)


def test_a_replica_killed_under_load_loses_no_request_and_pages(tmp_path, tiny_folder):
    replicas = {name: Replica(name, tiny_folder, *REPLICA_ARGS) for name in REPLICAS}
    inbox, daemons = AlertInbox(ROOT / "docs"), []
    try:
        for replica in replicas.values():
            replica.server.wait_ready()
        haproxy = HAProxy(tmp_path, list(replicas.values()))
        daemons.append(haproxy)
        haproxy.wait_up("blue", *REPLICAS)
        alertmanager = Alertmanager(alertmanager_config(inbox.url), tmp_path)
        daemons.append(alertmanager)
        targets = tmp_path / "targets.json"
        write_targets(targets, [replica.address for replica in replicas.values()])
        rule_dir = tmp_path / "rules"
        rule_dir.mkdir()
        port = free_port()
        prometheus = Prometheus(prometheus_config(
            targets, f"127.0.0.1:{port}", f"127.0.0.1:{alertmanager.port}",
            rewrite_rules(rule_dir, {PAGE: f"{PAGE_FOR_S}s"}),
            {"grafana_url": "http://grafana.test:3000", "docs_url": f"{inbox.url}/docs"},
        ), tmp_path, port)  # fmt: skip
        daemons.append(prometheus)
        wait_until(lambda: sum(t["health"] == "up" for t in prometheus.active_targets()
                               if t["labels"]["job"] == "vigil") == len(REPLICAS), 60,
                   what="Prometheus scrapes both replicas")  # fmt: skip

        victim = replicas["vigil-1"]
        # Streams first, so that one is surely on the victim when it dies; then short requests beside them.
        with StreamOutcomes(haproxy.url) as streams:
            wait_until(lambda: victim.server.engine_state()["num_unfinished"] >= 1, 60, interval=0.05,
                       what="a stream runs on the victim")  # fmt: skip
            with ClientLoop(haproxy.url, clients=4, max_tokens=24, max_seconds=240) as loop:
                wait_until(lambda: haproxy.api.server("blue", victim.name).sessions >= 2, 60, interval=0.02,
                           what="short requests in flight on the victim beside its stream")  # fmt: skip
                victim.server.process.kill()  # SIGKILL: no drain, no goodbye
                killed_at = time.monotonic()
                victim.server.process.wait()
                sent = loop.sent
                wait_until(lambda: loop.sent >= sent + SERVED_AFTER, 120, what="the loop is served by vigil-2 alone")
                wait_until(lambda: inbox.alerts(PAGE, "firing"), PAGE_WITHIN_S + 30, interval=0.2,
                           what=f"{PAGE} in the inbox")  # fmt: skip
                paged_after_s = time.monotonic() - killed_at
        [page] = [alert for alert in inbox.alerts(PAGE, "firing")]
        answered = loop.codes[200] + streams.outcomes["answered"]
        errors = sum(count for code, count in loop.codes.items() if code != 200) + streams.outcomes[
            "failed with an error"]
        print("\nscenario | requests sent | answered | failed with a clean error | lost | alerts expected | "
              "alerts received | time to alert")
        print(f"replica killed (SIGKILL) under load | {loop.sent + sum(streams.outcomes.values())} | {answered} | "
              f"{errors} | {streams.hung} | {PAGE} | {page['alertname']} for {page['labels']['instance']} | "
              f"{paged_after_s:.1f} s")
        assert loop.failures == [], loop.failures[:5]  # not-yet-answered requests were retried and answered
        assert streams.hung == 0, "a stream hung"
        assert streams.outcomes["failed with an error"] >= 1, "the victim's stream must have ended in an error"
        assert streams.slowest_error_s < CLEAN_ERROR_WITHIN_S
        assert page["labels"]["instance"] == victim.address
        assert paged_after_s <= PAGE_WITHIN_S, paged_after_s
        assert [alert for alert in inbox.alerts(PAGE, "firing") if alert["labels"]["instance"] != victim.address] == []
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
        for replica in replicas.values():
            replica.server.stop()
        inbox.close()
