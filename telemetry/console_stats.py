"""The live console's stat logger: each engine step's figures gathered into the open second, on the engine thread.

Only appends and sums happen here; percentiles, output checks and text are worked out when the second closes, on
the console's own thread (telemetry/console.py)."""

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from server.engine.stats import FinishedRequestStats, StepStats
from telemetry.stat_loggers.base import StatLogger


@dataclass(frozen=True)
class FinishedEntry:
    """A finished request as the console keeps it, with what its model's logger knew."""

    model: str
    stats: FinishedRequestStats
    trace_id: str | None
    eos_token_ids: tuple[int, ...]
    decode_tokens: Callable[[Sequence[int]], str] | None


@dataclass
class OpenSecond:
    """What the steps of one second brought, over every model."""

    running: dict[str, int] = field(default_factory=dict)  # each model's latest
    waiting: dict[str, int] = field(default_factory=dict)
    kv_usage: float = math.nan  # the highest of the second
    batch_seqs: list[int] = field(default_factory=list)
    batch_tokens: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    finished: list[FinishedEntry] = field(default_factory=list)


class SecondCollector:
    """The open second, shared by every model's logger; ``close`` hands it over and starts the next."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = OpenSecond()

    def close(self) -> OpenSecond:
        with self._lock:
            closed, self._open = self._open, OpenSecond()
        return closed

    def add(self, model: str, stats: StepStats, finished: list[FinishedEntry]) -> None:
        with self._lock:
            second = self._open
            second.running[model] = stats.num_running
            second.waiting[model] = stats.num_waiting
            usage = stats.num_kv_blocks_used / stats.num_kv_blocks_total
            second.kv_usage = usage if math.isnan(second.kv_usage) else max(second.kv_usage, usage)
            if stats.num_scheduled_seqs:
                second.batch_seqs.append(stats.num_scheduled_seqs)
                second.batch_tokens.append(stats.num_scheduled_tokens)
            second.ttft_s.extend(stats.time_to_first_token_s.values())
            second.itl_s.extend(stats.inter_token_latencies_s)
            second.prompt_tokens += stats.num_prompt_tokens
            second.generation_tokens += stats.num_generation_tokens
            second.preemptions += stats.num_preemptions
            second.prefix_queries += stats.prefix_cache_queries
            second.prefix_hits += stats.prefix_cache_hits
            second.draft_tokens += stats.num_draft_tokens
            second.accepted_tokens += stats.num_accepted_tokens
            second.finished.extend(finished)


class ConsoleStatLogger(StatLogger):
    """One model's steps into the shared open second. ``trace_id_of`` is read here, while the request's span is
    still open; ``decode_tokens`` is given only under ``--log-requests``."""

    def __init__(
        self,
        collector: SecondCollector,
        model: str,
        eos_token_ids: Sequence[int] = (),
        trace_id_of: Callable[[str], str | None] | None = None,
        decode_tokens: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        self.collector = collector
        self.model = model
        self.eos_token_ids = tuple(eos_token_ids)
        self.trace_id_of = trace_id_of
        self.decode_tokens = decode_tokens

    def record(self, stats: StepStats) -> None:
        finished = [
            FinishedEntry(self.model, request, self.trace_id_of(request.request_id) if self.trace_id_of else None,
                          self.eos_token_ids, self.decode_tokens)
            for request in stats.finished
        ]
        self.collector.add(self.model, stats, finished)
