"""One closed second into one row of the console's series, and each finished request into a row of its table."""

import math
from collections import Counter
from collections.abc import Sequence

from telemetry.console_stats import FinishedEntry, OpenSecond
from telemetry.quality import output_anomalies, repetition_ratio

SERVICE_FIELDS = (
    "requests_2xx", "requests_4xx", "requests_5xx", "errors", "running", "waiting",
    "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "itl_p99", "queue_p50", "queue_p95", "queue_p99",
    "queue_count", "queue_slow",
    "batch_seqs_p50", "batch_seqs_max", "batch_tokens_p50", "batch_tokens_max", "kv_usage", "prefix_hit_rate",
    "preemptions",
)
MODEL_FIELDS = (
    "output_tokens", "prompt_tokens", "decode_speed_p50", "output_len_p50", "output_len_max", "finished",
    "finished_length", "repetition_mean", "anomalies", "repetition_loops", "spec_acceptance",
    "ttft_count", "ttft_slow", "itl_count", "itl_slow",
)
HOST_FIELDS = ("host_cpu", "host_memory_used", "rss_bytes")
# Each GPU's series -> the VigilMetrics gauge it is read from.
GPU_FIELDS = {"temperature": "gpu_temperature", "memory_used": "gpu_memory_used", "utilization": "gpu_utilization",
              "power": "gpu_power", "throttled": "gpu_throttled"}  # fmt: skip


def gpu_fields(gpu_count: int) -> tuple[str, ...]:
    return tuple(f"gpu{index}_{name}" for index in range(gpu_count) for name in GPU_FIELDS)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _share(part: float, whole: float) -> float:
    return part / whole if whole else math.nan


def engine_row(
    second: OpenSecond, elapsed_s: float, anomalies: Counter, slow_thresholds_s: dict[str, float]
) -> dict[str, float]:
    """The series of the engine's steps and finished requests over ``elapsed_s`` (counts become rates).
    ``anomalies`` counts the second's output anomalies by kind (``finish_counts``); ``slow_thresholds_s`` has the
    ``ttft``, ``itl`` and ``queue`` thresholds of the alerts, above which an observation is slow."""
    finished = [entry.stats for entry in second.finished]
    queue = [t["queue_s"] for t in (request.timings() for request in finished) if t["queue_s"] is not None]
    speeds = [(r.num_generation_tokens - 1) / t["decode_s"] for r in finished
              if (t := r.timings())["decode_s"] and r.num_generation_tokens > 1]
    lengths = [request.num_generation_tokens for request in finished]
    served = [entry for entry in second.finished if entry.stats.finish_reason != "abort"]
    row = {
        "running": sum(second.running.values()) if second.running else math.nan,
        "waiting": sum(second.waiting.values()) if second.waiting else math.nan,
        "kv_usage": second.kv_usage,
        "prefix_hit_rate": _share(second.prefix_hits, second.prefix_queries),
        "preemptions": second.preemptions / elapsed_s,
        "batch_seqs_p50": quantile(second.batch_seqs, 0.5), "batch_seqs_max": max(second.batch_seqs, default=math.nan),
        "batch_tokens_p50": quantile(second.batch_tokens, 0.5),
        "batch_tokens_max": max(second.batch_tokens, default=math.nan),
        "output_tokens": second.generation_tokens / elapsed_s, "prompt_tokens": second.prompt_tokens / elapsed_s,
        "decode_speed_p50": quantile(speeds, 0.5),
        "output_len_p50": quantile(lengths, 0.5), "output_len_max": max(lengths, default=math.nan),
        "finished": len(finished) / elapsed_s,
        "finished_length": sum(r.finish_reason == "length" for r in finished) / elapsed_s,
        "repetition_mean": (sum(repetition_ratio(e.stats.output_token_ids) for e in served) / len(served)
                            if served else math.nan),
        "anomalies": anomalies.total() / elapsed_s,
        "repetition_loops": anomalies["repetition_loop"] / elapsed_s,
        "spec_acceptance": _share(second.accepted_tokens, second.draft_tokens),
        "ttft_count": len(second.ttft_s), "ttft_slow": sum(v > slow_thresholds_s["ttft"] for v in second.ttft_s),
        "itl_count": len(second.itl_s), "itl_slow": sum(v > slow_thresholds_s["itl"] for v in second.itl_s),
        "queue_count": len(queue), "queue_slow": sum(v > slow_thresholds_s["queue"] for v in queue),
    }
    percentiles = {"ttft": (second.ttft_s, (50, 90, 99)), "itl": (second.itl_s, (50, 90, 99)),
                   "queue": (queue, (50, 95, 99))}
    for name, (values, qs) in percentiles.items():
        row.update({f"{name}_p{q}": quantile(values, q / 100) for q in qs})
    return row


def _anomalies(entry: FinishedEntry) -> list[str]:
    stats = entry.stats
    return output_anomalies(stats.output_token_ids, stats.finish_reason, stats.stop_reason, entry.eos_token_ids)


def finish_counts(second: OpenSecond) -> tuple[Counter, Counter]:
    """Finish reasons and anomaly kinds of the second's finished requests."""
    reasons = Counter(entry.stats.finish_reason for entry in second.finished)
    kinds = Counter(kind for entry in second.finished for kind in _anomalies(entry))
    return reasons, kinds


def request_row(entry: FinishedEntry) -> dict[str, object]:
    """A row of the recent-requests table: counts and times, never the prompt; the output only when the model's
    logger was given a decoder (``--log-requests``)."""
    stats, timings = entry.stats, entry.stats.timings()
    row: dict[str, object] = {
        "id": stats.request_id, "model": entry.model, "prompt_tokens": stats.num_prompt_tokens,
        "output_tokens": stats.num_generation_tokens, "ttft_s": timings["ttft_s"],
        "duration_s": timings["duration_s"], "finish_reason": stats.finish_reason, "trace_id": entry.trace_id,
    }
    if entry.decode_tokens is not None:
        row["output"] = entry.decode_tokens(stats.output_token_ids)
    return row
