"""Engine stats into the Prometheus metrics: per-step gauges, counters and histograms, and per-request latency,
sampling and output-quality histograms."""

import threading
import time
from collections.abc import Callable, Sequence

from server.engine.stats import FinishedRequestStats, StepStats
from telemetry.metrics import VigilMetrics
from telemetry.quality import output_anomalies, repetition_ratio
from telemetry.stat_loggers.base import StatLogger
from telemetry.throughput import WindowedRate

# TTFT is not here: it is observed when the first token comes (so a slow first token pages while its request is
# still streaming), or at the end of a request given up on before one.
LATENCY_HISTOGRAMS = (
    ("request_duration", "duration_s"), ("queue_time", "queue_s"), ("prefill_time", "prefill_s"),
    ("decode_time", "decode_s"),
)


class PrometheusStatLogger(StatLogger):
    """One engine's stats under its ``model`` label (by default the metrics' first model). ``trace_id_of`` gives a
    request's trace id, attached to its latency observations as an exemplar."""

    def __init__(
        self,
        metrics: VigilMetrics,
        eos_token_ids: Sequence[int] = (),
        matmul_peak_flops: float | None = None,
        trace_id_of: Callable[[str], str | None] | None = None,
        model: str | None = None,
    ) -> None:
        self.metrics = metrics
        self.eos_token_ids = tuple(eos_token_ids)
        self.matmul_peak_flops = matmul_peak_flops
        self.trace_id_of = trace_id_of
        self.model = model = metrics.model if model is None else model
        # Label children bound once: a labels() lookup per observation would cost the engine thread every step.
        self._running = metrics.num_running.labels(model)
        self._waiting = metrics.num_waiting.labels(model)
        self._kv_usage = metrics.kv_cache_usage.labels(model)
        self._kv_used = metrics.kv_cache_blocks.labels(model, "used")
        self._kv_free = metrics.kv_cache_blocks.labels(model, "free")
        self._kv_waste = metrics.kv_cache_waste.labels(model)
        self._batch_size = metrics.batch_size.labels(model)
        self._batch_tokens = metrics.batch_tokens.labels(model)
        self._step_duration = metrics.step_duration.labels(model)
        self._rank_step_durations: list = []
        self._preemptions = metrics.preemptions.labels(model)
        self._prefix_queries = metrics.prefix_cache_queries.labels(model)
        self._prefix_hits = metrics.prefix_cache_hits.labels(model)
        self._prompt_tokens = metrics.prompt_tokens.labels(model)
        self._generation_tokens = metrics.generation_tokens.labels(model)
        self._inter_token_latency = metrics.inter_token_latency.labels(model)
        self._ttft = metrics.time_to_first_token.labels(model)
        self._model_flops = metrics.model_flops.labels(model)
        self._draft_tokens = metrics.spec_decode_draft_tokens.labels(model)
        self._accepted_tokens = metrics.spec_decode_accepted_tokens.labels(model)
        self._accepted_length = metrics.spec_decode_accepted_length.labels(model)
        self._lock = threading.Lock()
        self._generation_rate = WindowedRate()
        self._flops = WindowedRate()
        self._busy_seconds = WindowedRate()
        if matmul_peak_flops:
            metrics.matmul_peak.labels(model).set(matmul_peak_flops)

    def record(self, stats: StepStats) -> None:
        self._running.set(stats.num_running)
        self._waiting.set(stats.num_waiting)
        self._kv_usage.set(stats.num_kv_blocks_used / stats.num_kv_blocks_total)
        self._kv_used.set(stats.num_kv_blocks_used)
        self._kv_free.set(stats.num_kv_blocks_total - stats.num_kv_blocks_used)
        self._kv_waste.set(stats.kv_cache_waste_ratio)
        self._model_flops.inc(stats.model_flops)
        if stats.num_scheduled_seqs:
            self._batch_size.observe(stats.num_scheduled_seqs)
            self._batch_tokens.observe(stats.num_scheduled_tokens)
            self._step_duration.observe(stats.step_duration_s)
            self._observe_ranks(stats.rank_step_durations_s)
        self._preemptions.inc(stats.num_preemptions)
        self._prefix_queries.inc(stats.prefix_cache_queries)
        self._prefix_hits.inc(stats.prefix_cache_hits)
        self._prompt_tokens.inc(stats.num_prompt_tokens)
        self._generation_tokens.inc(stats.num_generation_tokens)
        if stats.num_draft_tokens:
            self._draft_tokens.inc(stats.num_draft_tokens)
            self._accepted_tokens.inc(stats.num_accepted_tokens)
            for length in stats.accepted_lengths:
                self._accepted_length.observe(length)
        for value in stats.inter_token_latencies_s:
            self._inter_token_latency.observe(value)
        for request_id, seconds in stats.time_to_first_token_s.items():
            self._ttft.observe(seconds, exemplar=self._exemplar(request_id))
        for finished in stats.finished:
            self._record_finished(finished)
        with self._lock:
            self._generation_rate.add(stats.timestamp, stats.num_generation_tokens)
            if stats.num_scheduled_seqs:
                self._flops.add(stats.timestamp, stats.model_flops)
                self._busy_seconds.add(stats.timestamp, stats.step_duration_s)

    def _observe_ranks(self, durations: tuple[float, ...]) -> None:
        """Each tensor-parallel rank's forward pass, under its own ``rank`` label (children bound on first use)."""
        while len(self._rank_step_durations) < len(durations):
            rank = str(len(self._rank_step_durations))
            self._rank_step_durations.append(self.metrics.rank_step_duration.labels(self.model, rank))
        for child, seconds in zip(self._rank_step_durations, durations, strict=False):
            child.observe(seconds)

    def tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            generation_rate = self._generation_rate.rate(now)
            flops, busy_seconds = self._flops.total(now), self._busy_seconds.total(now)
        model = self.model
        self.metrics.generation_throughput.labels(model).set(generation_rate)
        if self.matmul_peak_flops:
            utilization = flops / busy_seconds / self.matmul_peak_flops if busy_seconds else 0.0
            self.metrics.flops_utilization.labels(model).set(utilization)

    def _exemplar(self, request_id: str) -> dict[str, str] | None:
        trace_id = self.trace_id_of(request_id) if self.trace_id_of is not None else None
        return {"trace_id": trace_id} if trace_id else None

    def _record_finished(self, stats: FinishedRequestStats) -> None:
        m, model = self.metrics, self.model
        exemplar = self._exemplar(stats.request_id)
        timings = stats.timings()
        if timings["ttft_s"] is None and stats.finish_reason == "abort":
            # Given up on (by its client, a timeout, a shutdown) before its first token: it waited at least this
            # long for one, and the TTFT SLO must count it at least that slow rather than not at all.
            self._ttft.observe(timings["duration_s"], exemplar=exemplar)
        for name, key in LATENCY_HISTOGRAMS:
            if timings[key] is not None:
                getattr(m, name).labels(model).observe(timings[key], exemplar=exemplar)
        params = stats.sampling_params
        m.request_prompt_tokens.labels(model).observe(stats.num_prompt_tokens)
        m.request_generation_tokens.labels(model).observe(stats.num_generation_tokens)
        m.request_temperature.labels(model).observe(params.temperature)
        m.request_top_p.labels(model).observe(params.top_p)
        m.request_max_tokens.labels(model).observe(stats.max_tokens)
        m.request_finished.labels(model, stats.finish_reason).inc()
        decode_s = timings["decode_s"]
        if decode_s and stats.num_generation_tokens > 1:
            m.request_decode_speed.labels(model).observe((stats.num_generation_tokens - 1) / decode_s)
        tokens = stats.output_token_ids
        if stats.finish_reason != "abort":
            m.repetition_ratio.labels(model).observe(repetition_ratio(tokens))
        for kind in output_anomalies(tokens, stats.finish_reason, stats.stop_reason, self.eos_token_ids):
            m.output_anomalies.labels(model, kind).inc()
