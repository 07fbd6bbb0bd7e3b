"""Engine stats as structlog lines: one per finished request, and a periodic summary of the engine's state."""

import threading
import time
from collections.abc import Callable, Sequence

import structlog

from server.engine.stats import FinishedRequestStats, StepStats
from telemetry.quality import output_anomalies, repetition_ratio
from telemetry.stat_loggers.base import StatLogger
from telemetry.throughput import WindowedRate

STATS_LOG_INTERVAL_S = 10.0


class LoggingStatLogger(StatLogger):
    """Prompts are never logged; outputs only when ``decode_tokens`` is given (``--log-requests``)."""

    def __init__(
        self,
        eos_token_ids: Sequence[int] = (),
        decode_tokens: Callable[[Sequence[int]], str] | None = None,
        trace_id_of: Callable[[str], str | None] | None = None,
        interval_s: float = STATS_LOG_INTERVAL_S,
    ) -> None:
        self.eos_token_ids = tuple(eos_token_ids)
        self.decode_tokens = decode_tokens
        self.trace_id_of = trace_id_of
        self.interval_s = interval_s
        self.log = structlog.get_logger("vigil.stats")
        self._lock = threading.Lock()
        self._generation_rate = WindowedRate()
        self._prompt_rate = WindowedRate()
        self._interval = _IntervalTotals()
        self._last_line_at = time.monotonic()
        self._last_step: StepStats | None = None

    def record(self, stats: StepStats) -> None:
        for finished in stats.finished:
            self._log_finished(finished)
        with self._lock:
            self._generation_rate.add(stats.timestamp, stats.num_generation_tokens)
            self._prompt_rate.add(stats.timestamp, stats.num_prompt_tokens)
            self._interval.add(stats)
            self._last_step = stats

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_line_at < self.interval_s:
                return
            interval, last = self._interval, self._last_step
            generation_rate, prompt_rate = self._generation_rate.rate(now), self._prompt_rate.rate(now)
            self._interval, self._last_line_at = _IntervalTotals(), now
        if not interval.active or last is None:
            return
        self.log.info(
            "engine_stats",
            prompt_throughput_tokens_per_s=round(prompt_rate, 1),
            generation_throughput_tokens_per_s=round(generation_rate, 1),
            running=last.num_running,
            waiting=last.num_waiting,
            kv_cache_usage_ratio=round(last.num_kv_blocks_used / last.num_kv_blocks_total, 4),
            preemptions=interval.preemptions,
            prefix_cache_hit_rate=round(interval.prefix_hits / interval.prefix_queries, 4)
            if interval.prefix_queries else 0.0,
        )

    def _log_finished(self, stats: FinishedRequestStats) -> None:
        tokens = stats.output_token_ids
        extra = {"output": self.decode_tokens(tokens)} if self.decode_tokens is not None else {}
        self.log.info(
            "request_finished",
            request_id=stats.request_id,
            trace_id=self.trace_id_of(stats.request_id) if self.trace_id_of is not None else None,
            finish_reason=stats.finish_reason,
            stop_reason=stats.stop_reason,
            prompt_tokens=stats.num_prompt_tokens,
            generation_tokens=stats.num_generation_tokens,
            cached_tokens=stats.num_cached_tokens,
            preemptions=stats.num_preemptions,
            repetition_ratio=round(repetition_ratio(tokens), 4),
            anomalies=output_anomalies(tokens, stats.finish_reason, stats.stop_reason, self.eos_token_ids),
            **{k: round(v, 6) for k, v in stats.timings().items() if v is not None},
            **extra,
        )


class _IntervalTotals:
    """What happened since the last periodic stats line."""

    def __init__(self) -> None:
        self.active = False
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def add(self, stats: StepStats) -> None:
        self.active = self.active or stats.num_scheduled_seqs > 0
        self.preemptions += stats.num_preemptions
        self.prefix_queries += stats.prefix_cache_queries
        self.prefix_hits += stats.prefix_cache_hits
