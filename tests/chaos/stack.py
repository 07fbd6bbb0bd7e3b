"""The chaos suite's fleet on 127.0.0.1: two replicas behind the real HAProxy, the real Prometheus (scraping them
every second, with the project's rules and the `for:` of the alerts a scenario expects shrunk to seconds), the
real Alertmanager and the alert inbox; and the clients and table row the scenarios share."""

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from server.bench.local_server import SERVER_PROGRAM, free_port
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

REPLICAS = ("vigil-1", "vigil-2")
REPLICA_ARGS = ("--max-num-seqs", "8")
STREAMS = 3
# Prometheus tells Alertmanager that a firing alert lasts four resend delays past its last evaluation; with the
# default minute, the heartbeat would go on for 4 minutes after Prometheus stopped.
PROMETHEUS_FLAGS = ("--rules.alert.resend-delay=1s",)
STREAM_TOKENS = 480  # up to the tiny model's 512 positions: a stream outlives the wait before a fault


class ChaosStack:
    def __init__(self, workdir: Path, model_folder: Path, fast_for: dict[str, str],
                 program: tuple[str, ...] = SERVER_PROGRAM, replica_args: tuple[str, ...] = ()) -> None:  # fmt: skip
        self._workdir, self._fast_for = workdir, fast_for
        self.replicas = {name: Replica(name, model_folder, *REPLICA_ARGS, *replica_args, program=program)
                         for name in REPLICAS}  # fmt: skip
        self.inbox = AlertInbox(ROOT / "docs")
        self._daemons: list = []

    def __enter__(self) -> "ChaosStack":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        for replica in self.replicas.values():
            replica.server.wait_ready()
        self.haproxy = HAProxy(self._workdir, list(self.replicas.values()))
        self._daemons.append(self.haproxy)
        self.haproxy.wait_up("blue", *REPLICAS)
        alertmanager = Alertmanager(alertmanager_config(self.inbox.url), self._workdir)
        self._daemons.append(alertmanager)
        targets = self._workdir / "targets.json"
        write_targets(targets, [replica.address for replica in self.replicas.values()])
        rule_dir = self._workdir / "rules"
        rule_dir.mkdir()
        port = free_port()
        self.prometheus = Prometheus(prometheus_config(
            targets, f"127.0.0.1:{port}", f"127.0.0.1:{alertmanager.port}", rewrite_rules(rule_dir, self._fast_for),
            {"grafana_url": "http://grafana.test:3000", "docs_url": f"{self.inbox.url}/docs"},
        ), self._workdir, port, PROMETHEUS_FLAGS)  # fmt: skip
        self._daemons.append(self.prometheus)
        wait_until(lambda: sum(target["health"] == "up" for target in self.prometheus.active_targets()
                               if target["labels"]["job"] == "vigil") == len(REPLICAS), 60,
                   what="Prometheus scrapes both replicas")  # fmt: skip

    def wait_for_page(self, alertname: str, timeout: float) -> dict:
        wait_until(lambda: self.inbox.alerts(alertname, "firing"), timeout, interval=0.2,
                   what=f"{alertname} in the inbox")  # fmt: skip
        return self.inbox.alerts(alertname, "firing")[0]

    def pages(self, receiver: str = "critical") -> list[tuple[str, str]]:
        """Every alert the inbox received through ``receiver`` (pages by default), as (alert, instance), without
        repeats."""
        found = [(alert["alertname"], alert["labels"].get("instance", ""))
                 for alert in self.inbox.alerts(status="firing", receiver=receiver)]  # fmt: skip
        return sorted(set(found))

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for daemon in reversed(self._daemons):
            daemon.stop()
        for replica in self.replicas.values():
            replica.server.stop()
        self.inbox.close()


def is_error_event(line: str) -> bool:
    """The server's error event (``data: {"error": ...}``, server/api/sse.py). Not a substring test: a chunk whose
    text is the token ``error`` reads ``"text":"error"``, and the tiny random model samples it about once in 100
    streams."""
    return line.startswith("data: {") and "error" in json.loads(line.removeprefix("data: "))


@dataclass
class StreamOutcomes:
    """Streaming clients through ``url``, each sending one long stream after another: how each stream ended, and
    the longest a failing one went silent before its error (a hang would show here, or keep a thread alive)."""

    url: str
    timeout_s: float = 30.0
    outcomes: Counter = field(default_factory=Counter)
    slowest_error_s: float = 0.0
    hung: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(STREAMS)]

    def _run(self) -> None:
        body = {"model": "smollm", "prompt": "Once", "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                "temperature": 1.0, "stream": True}
        while not self._stop.is_set():
            last_event, outcome = time.monotonic(), "failed with an error"
            try:
                with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=self.timeout_s) as reply:
                    done = False
                    for line in reply.iter_lines():
                        last_event = time.monotonic()
                        if is_error_event(line):
                            break
                        done = done or line == "data: [DONE]"
                    if reply.status_code == 200 and done:
                        outcome = "answered"
            except (httpx.HTTPError, ValueError):  # ValueError: an event that is not JSON fails the stream too
                pass
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
            thread.join(2 * self.timeout_s)
        self.hung = sum(thread.is_alive() for thread in self._threads)


HEADER = ("scenario | requests sent | answered | failed with a clean error | lost | alerts expected | "
          "alerts received | time to alert")
# Every row printed in this session, for the whole table at the end of the run (tests/chaos/conftest.py).
ROWS: list[str] = []


def print_row(scenario: str, loop: ClientLoop, streams: StreamOutcomes | None, expected: str,
              received: list[tuple[str, str]], alert_after_s: float | None) -> None:  # fmt: skip
    """The scenario's row of the chaos table (pytest -s shows it; the note collects the rows)."""
    stream_counts = streams.outcomes if streams is not None else Counter()
    sent = loop.sent + sum(stream_counts.values())
    answered = loop.codes[200] + stream_counts["answered"]
    lost = streams.hung if streams is not None else 0
    alerts = ", ".join(f"{name} for {instance}" for name, instance in received) or "none"
    row = (f"{scenario} | {sent} | {answered} | {sent - answered - lost} | {lost} | {expected} | {alerts} | "
           f"{'-' if alert_after_s is None else f'{alert_after_s:.1f} s'}")
    ROWS.append(row)
    print(f"\n{HEADER}\n{row}")
