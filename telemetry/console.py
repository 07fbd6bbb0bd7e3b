"""The live console's data: a bounded ring of per-second series, fed by the engines' stats and by the metrics
that the Prometheus exporter serves, the last finished requests, and each indicator's state. Once a second, on
its own thread, the open second closes into a row; server/api/console.py serves ``snapshot`` as JSON."""

import dataclasses
import math
import os
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from server.engine.engine import LLMEngine
from telemetry.console_health import RingWindow, evaluate, load_thresholds
from telemetry.console_ring import SeriesRing
from telemetry.console_rows import (
    GPU_FIELDS,
    HOST_FIELDS,
    MODEL_FIELDS,
    SERVICE_FIELDS,
    engine_row,
    finish_counts,
    gpu_fields,
    request_row,
)
from telemetry.console_stats import ConsoleStatLogger, SecondCollector
from telemetry.metrics import VigilMetrics

# Routes that are not API traffic, as the alert rules leave them out (route!~"/metrics|/livez|/readyz|/health"),
# and the console's own.
NOT_API_ROUTES = re.compile(r"/metrics|/livez|/readyz|/health|/console.*|other")
FIRST_WINDOW_S = 900  # what a snapshot holds when the caller has none yet


@dataclass(frozen=True)
class ConsoleConfig:
    recent_requests: int = 50  # rows of the recent-requests table
    history_s: int = 3600  # seconds the ring holds, one row a second
    trace_url: str | None = None  # a trace UI's address of one trace, with {trace_id} in it


def _samples(metric: Collector) -> list[Sample]:
    return [sample for family in metric.collect() for sample in family.samples
            if not sample.name.endswith("_created")]


def _gauge(metric: Collector) -> float:
    samples = _samples(metric)
    return samples[0].value if samples else math.nan


def _rss_bytes() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Console:
    def __init__(self, metrics: VigilMetrics, gpu_count: int, config: ConsoleConfig = ConsoleConfig()) -> None:
        self.metrics = metrics
        self.gpu_count = gpu_count
        self.config = config
        self.thresholds = load_thresholds()
        self.fields = SERVICE_FIELDS + MODEL_FIELDS + HOST_FIELDS + gpu_fields(gpu_count)
        self.ring = SeriesRing(self.fields, config.history_s)
        self.collector = SecondCollector()
        self.models: dict[str, dict] = {}
        self._slow_s = {name: slo["threshold_s"] for name, slo in self.thresholds["slo"].items()}
        self._slow_s["queue"] = self.thresholds["rules"]["queue_time_p95_s"]["warning"]["value"]
        self._lock = threading.Lock()
        self._recent: deque[dict] = deque(maxlen=config.recent_requests)
        self._totals = {"finish_reasons": Counter(), "anomalies": Counter()}
        self._counters: dict[tuple[str, tuple], float] = {}
        self._indicators: list[dict] = []
        self._last_close = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vigil-console", daemon=True)

    def logger(
        self,
        model: str,
        engine: LLMEngine,
        trace_id_of: Callable[[str], str | None] | None,
        decode_tokens: Callable[[Sequence[int]], str] | None,
    ) -> ConsoleStatLogger:
        """``model``'s stat logger, and its description for the page's "what is running"."""
        self.models[model] = {
            "engine": dataclasses.asdict(engine.info),
            "kv_cache": {**dataclasses.asdict(engine.cache_info), "total_bytes": engine.cache_info.total_bytes},
            "max_model_len": engine.max_model_len,
        }
        return ConsoleStatLogger(self.collector, model, engine.eos_token_ids, trace_id_of, decode_tokens)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(1.0 - time.time() % 1.0):
            self.close_second()

    def close_second(self) -> None:
        now = time.monotonic()
        elapsed_s, self._last_close = max(now - self._last_close, 1e-3), now
        second = self.collector.close()
        reasons, kinds = finish_counts(second)
        row = engine_row(second, elapsed_s, kinds, self._slow_s)
        row.update(self._http_row(elapsed_s))
        row.update(self._infra_row())
        stamp = int(time.time())
        self.ring.append(stamp, row)
        indicators = evaluate(RingWindow(self.fields, *self.ring.window(stamp - 3600), stamp), self.thresholds,
                              self.gpu_count)
        with self._lock:
            self._totals["finish_reasons"].update(reasons)
            self._totals["anomalies"].update(kinds)
            self._recent.extend(request_row(entry) for entry in second.finished)
            self._indicators = [dataclasses.asdict(indicator) for indicator in indicators]

    def _delta(self, key: tuple, value: float) -> float:
        before = self._counters.get(key, 0.0)
        self._counters[key] = value
        return max(0.0, value - before)

    def _http_row(self, elapsed_s: float) -> dict[str, float]:
        row = {"requests_2xx": 0.0, "requests_4xx": 0.0, "requests_5xx": 0.0, "errors": 0.0}
        for sample in _samples(self.metrics.http_requests):
            delta = self._delta(("http", tuple(sample.labels.items())), sample.value)
            if not NOT_API_ROUTES.fullmatch(sample.labels["route"]) and sample.labels["code"][0] in "245":
                row[f"requests_{sample.labels['code'][0]}xx"] += delta / elapsed_s
        for sample in _samples(self.metrics.request_errors):
            row["errors"] += self._delta(("errors", tuple(sample.labels.items())), sample.value) / elapsed_s
        return row

    def _infra_row(self) -> dict[str, float]:
        m = self.metrics
        row = {"host_cpu": _gauge(m.host_cpu), "host_memory_used": _gauge(m.host_memory_used),
               "rss_bytes": _rss_bytes()}
        for field, attribute in GPU_FIELDS.items():
            for sample in _samples(getattr(m, attribute)):
                row[f"gpu{sample.labels['gpu']}_{field}"] = sample.value
        return row

    def totals(self) -> dict[str, dict[str, float]]:
        """Counts since start: finish reasons and anomalies seen here; errors and routing decisions as /metrics
        counts them."""
        with self._lock:
            totals = {name: dict(counter) for name, counter in self._totals.items()}
        totals["errors"] = {s.labels["reason"]: s.value for s in _samples(self.metrics.request_errors)}
        totals["routing"] = {f"{s.labels['alias']} -> {s.labels['model']} ({s.labels['reason']})": s.value
                             for s in _samples(self.metrics.router_decisions)}
        return totals

    def snapshot(self, after_second: int | None) -> dict:
        """The rows after ``after_second`` (the last FIRST_WINDOW_S seconds when None), the recent requests, the
        totals, each indicator's state, and the ring's size."""
        now = int(time.time())
        seconds, series = self.ring.since(now - FIRST_WINDOW_S if after_second is None else after_second)
        with self._lock:
            recent, indicators = list(self._recent)[::-1], list(self._indicators)
        return {
            "now": now, "t": seconds, "series": series, "requests": recent, "indicators": indicators,
            "totals": self.totals(), "models": self.models, "thresholds": self.thresholds,
            "ring": {"capacity_rows": self.ring.capacity, "fields": len(self.fields), "bytes": self.ring.nbytes,
                     "recent_requests": self.config.recent_requests},
        }
