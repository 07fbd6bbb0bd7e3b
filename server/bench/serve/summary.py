"""Latency distributions, throughputs, goodput and failure counts of a run: pure functions over records."""

from collections import Counter
from dataclasses import dataclass

import numpy as np

from server.bench.serve.client import RequestRecord


@dataclass(frozen=True)
class Distribution:
    """Milliseconds."""

    mean: float
    median: float
    p90: float
    p99: float


@dataclass(frozen=True)
class SLO:
    """Milliseconds; a request meets the SLO when it is within every limit that is set."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None


@dataclass(frozen=True)
class Summary:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None  # requests/s within the SLO; None without one
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2el: Distribution | None
    failures: dict[str, int]  # reason -> count, most frequent first


def parse_slo(text: str | None) -> SLO | None:
    """``ttft=MS,tpot=MS,e2el=MS``, any subset."""
    if not text:
        return None
    limits: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip().lower()
        if name not in ("ttft", "tpot", "e2el") or name in limits:
            raise ValueError(f"--slo: expected ttft=MS,tpot=MS,e2el=MS (any subset), got {text!r}")
        try:
            limits[name] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {name} needs a number of milliseconds, got {value!r}") from None
    return SLO(**limits)


def distribution(values_s: list[float]) -> Distribution | None:
    if not values_s:
        return None
    ms = np.asarray(values_s) * 1000.0
    return Distribution(float(ms.mean()), *(float(np.percentile(ms, q)) for q in (50, 90, 99)))


def tpot_s(record: RequestRecord) -> float | None:
    """Time per output token after the first; None for a request of one token or none."""
    if record.ttft_s is None or record.output_tokens < 2:
        return None
    return (record.latency_s - record.ttft_s) / (record.output_tokens - 1)


def meets(record: RequestRecord, slo: SLO) -> bool:
    tpot = tpot_s(record) or 0.0
    checks = ((slo.ttft, record.ttft_s), (slo.tpot, tpot), (slo.e2el, record.latency_s))
    return all(limit is None or (value is not None and value * 1000.0 <= limit) for limit, value in checks)


def failure_counts(records: list[RequestRecord]) -> dict[str, int]:
    return dict(Counter(r.error for r in records if not r.ok).most_common())


def summarize(records: list[RequestRecord], duration_s: float, slo: SLO | None) -> Summary:
    done = [r for r in records if r.ok]
    input_tokens = sum(r.prompt_tokens or 0 for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    tpots = [t for t in map(tpot_s, done) if t is not None]
    return Summary(
        completed=len(done),
        failed=len(records) - len(done),
        duration_s=duration_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_throughput=len(done) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        goodput=None if slo is None else sum(meets(r, slo) for r in done) / duration_s,
        ttft=distribution([r.ttft_s for r in done if r.ttft_s is not None]),
        tpot=distribution(tpots),
        itl=distribution([gap for r in done for gap in r.itl_s]),
        e2el=distribution([r.latency_s for r in done]),
        failures=failure_counts(records),
    )
