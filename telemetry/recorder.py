"""Fans the engine's stats out to Prometheus metrics, OpenTelemetry spans and structlog lines."""

import threading
import time
from collections.abc import Callable, Sequence

import structlog

from server.engine.request import INTERNAL_REQUEST_PREFIX
from server.engine.stats import FinishedRequestStats, StepStats
from telemetry.metrics import VigilMetrics
from telemetry.quality import output_anomalies, repetition_ratio
from telemetry.throughput import WindowedRate
from telemetry.tracing import RequestTracer

STATS_LOG_INTERVAL_S = 10.0


class StatsRecorder:
    """Subscribed to ``LLMEngine.stats_listeners``: ``on_step`` runs on the engine thread, once per step.

    ``tick`` runs on a background timer, so that windowed rates decay and the periodic stats line appears
    even when no step runs.
    """

    def __init__(
        self,
        metrics: VigilMetrics,
        tracer: RequestTracer | None = None,
        eos_token_ids: Sequence[int] = (),
        decode_tokens: Callable[[Sequence[int]], str] | None = None,
        stats_log_interval_s: float = STATS_LOG_INTERVAL_S,
        matmul_peak_flops: float | None = None,
    ) -> None:
        self.metrics = metrics
        self.tracer = tracer
        self.eos_token_ids = tuple(eos_token_ids)
        self.decode_tokens = decode_tokens
        self.log = structlog.get_logger("vigil.stats")
        self.stats_log_interval_s = stats_log_interval_s
        self._generation_rate = WindowedRate()
        self._prompt_rate = WindowedRate()
        self._flops = WindowedRate()
        self._busy_seconds = WindowedRate()
        self.matmul_peak_flops = matmul_peak_flops
        if matmul_peak_flops:
            metrics.matmul_peak.labels(metrics.model).set(matmul_peak_flops)
        self._lock = threading.Lock()
        self._interval = _IntervalTotals()
        self._last_stats_log = time.monotonic()
        self._last_step: StepStats | None = None
        model = metrics.model
        m = metrics
        self._step_metrics = (
            m.num_running.labels(model), m.num_waiting.labels(model), m.kv_cache_usage.labels(model),
            m.kv_cache_blocks.labels(model, "used"), m.kv_cache_blocks.labels(model, "free"),
            m.batch_size.labels(model), m.batch_tokens.labels(model), m.step_duration.labels(model),
            m.preemptions.labels(model), m.prefix_cache_queries.labels(model), m.prefix_cache_hits.labels(model),
            m.prompt_tokens.labels(model), m.generation_tokens.labels(model),
            m.inter_token_latency.labels(model), m.kv_cache_waste.labels(model), m.model_flops.labels(model),
        )

    def on_step(self, stats: StepStats) -> None:
        (running, waiting, usage, used, free, batch_size, batch_tokens, step_duration, preemptions,
         prefix_queries, prefix_hits, prompt_tokens, generation_tokens, itl, waste, flops) = self._step_metrics
        running.set(stats.num_running)
        waiting.set(stats.num_waiting)
        usage.set(stats.num_kv_blocks_used / stats.num_kv_blocks_total)
        used.set(stats.num_kv_blocks_used)
        free.set(stats.num_kv_blocks_total - stats.num_kv_blocks_used)
        waste.set(stats.kv_cache_waste_ratio)
        flops.inc(stats.model_flops)
        if stats.num_scheduled_seqs:
            batch_size.observe(stats.num_scheduled_seqs)
            batch_tokens.observe(stats.num_scheduled_tokens)
            step_duration.observe(stats.step_duration_s)
        preemptions.inc(stats.num_preemptions)
        prefix_queries.inc(stats.prefix_cache_queries)
        prefix_hits.inc(stats.prefix_cache_hits)
        prompt_tokens.inc(stats.num_prompt_tokens)
        generation_tokens.inc(stats.num_generation_tokens)
        for value in stats.inter_token_latencies_s:
            itl.observe(value)
        if self.tracer is not None:
            for event in stats.events:
                self.tracer.event(event.request_id, event.kind, event.timestamp)
        for finished in stats.finished:
            if not finished.request_id.startswith(INTERNAL_REQUEST_PREFIX):
                self._record_finished(finished)
        with self._lock:
            self._generation_rate.add(stats.timestamp, stats.num_generation_tokens)
            self._prompt_rate.add(stats.timestamp, stats.num_prompt_tokens)
            if stats.num_scheduled_seqs:
                self._flops.add(stats.timestamp, stats.model_flops)
                self._busy_seconds.add(stats.timestamp, stats.step_duration_s)
            self._interval.add(stats)
            self._last_step = stats

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            generation_rate = self._generation_rate.rate(now)
            prompt_rate = self._prompt_rate.rate(now)
            flops, busy_seconds = self._flops.total(now), self._busy_seconds.total(now)
            due = now - self._last_stats_log >= self.stats_log_interval_s
            interval, last = (self._interval, self._last_step) if due else (None, None)
            if due:
                self._interval = _IntervalTotals()
                self._last_stats_log = now
        self.metrics.generation_throughput.labels(self.metrics.model).set(generation_rate)
        if self.matmul_peak_flops:
            utilization = flops / busy_seconds / self.matmul_peak_flops if busy_seconds else 0.0
            self.metrics.flops_utilization.labels(self.metrics.model).set(utilization)
        if interval is not None and interval.active and last is not None:
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

    def _record_finished(self, stats: FinishedRequestStats) -> None:
        m, model = self.metrics, self.metrics.model
        trace_id = self.tracer.trace_id(stats.request_id) if self.tracer is not None else None
        exemplar = {"trace_id": trace_id} if trace_id else None
        timings = request_timings(stats)
        for histogram, key in (
            (m.request_duration, "duration_s"), (m.time_to_first_token, "ttft_s"), (m.queue_time, "queue_s"),
            (m.prefill_time, "prefill_s"), (m.decode_time, "decode_s"),
        ):
            if timings.get(key) is not None:
                histogram.labels(model).observe(timings[key], exemplar=exemplar)
        params = stats.sampling_params
        m.request_prompt_tokens.labels(model).observe(stats.num_prompt_tokens)
        m.request_generation_tokens.labels(model).observe(stats.num_generation_tokens)
        m.request_temperature.labels(model).observe(params.temperature)
        m.request_top_p.labels(model).observe(params.top_p)
        m.request_max_tokens.labels(model).observe(stats.max_tokens)
        m.request_finished.labels(model, stats.finish_reason).inc()
        if timings.get("decode_s") and stats.num_generation_tokens > 1:
            m.request_decode_speed.labels(model).observe((stats.num_generation_tokens - 1) / timings["decode_s"])
        tokens = stats.output_token_ids
        ratio = repetition_ratio(tokens)
        if stats.finish_reason != "abort":
            m.repetition_ratio.labels(model).observe(ratio)
        anomalies = output_anomalies(tokens, stats.finish_reason, stats.stop_reason, self.eos_token_ids)
        for kind in anomalies:
            m.output_anomalies.labels(model, kind).inc()
        if self.tracer is not None:
            self.tracer.finish(stats)
        extra = {"output": self.decode_tokens(tokens)} if self.decode_tokens is not None else {}
        self.log.info(
            "request_finished",
            request_id=stats.request_id,
            trace_id=trace_id,
            finish_reason=stats.finish_reason,
            stop_reason=stats.stop_reason,
            prompt_tokens=stats.num_prompt_tokens,
            generation_tokens=stats.num_generation_tokens,
            cached_tokens=stats.num_cached_tokens,
            preemptions=stats.num_preemptions,
            repetition_ratio=round(ratio, 4),
            anomalies=anomalies,
            **{k: round(v, 6) for k, v in timings.items() if v is not None},
            **extra,
        )


def request_timings(stats: FinishedRequestStats) -> dict[str, float | None]:
    """Queue, prefill, decode and end-to-end intervals of a finished request, in seconds."""

    def between(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else max(0.0, end - start)

    return {
        "queue_s": between(stats.arrival_time, stats.scheduled_time),
        "ttft_s": between(stats.arrival_time, stats.first_token_time),
        "prefill_s": between(stats.scheduled_time, stats.first_token_time),
        "decode_s": between(stats.first_token_time, stats.last_token_time),
        "duration_s": between(stats.arrival_time, stats.finished_time),
    }


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
