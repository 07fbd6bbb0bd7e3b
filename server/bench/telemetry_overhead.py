"""Telemetry's cost: offline throughput with the stat loggers on and off, alternated in one run, and the time to
render /metrics once 10,000 finished requests have been recorded."""

import argparse
import statistics
import time

from prometheus_client import CollectorRegistry

from server.bench.offline import random_prompts, time_engine, warm_up
from server.bench.timed import Timed
from server.engine.builder import build_engine
from server.engine.request import SamplingParams
from server.engine.stats import FinishedRequestStats, StepStats
from server.engine_args import engine_config_from_args
from telemetry.logging import configure_logging
from telemetry.metrics import VigilMetrics
from telemetry.service import Telemetry, TelemetryConfig
from telemetry.stat_loggers.prometheus import PrometheusStatLogger


def synthetic_finished(index: int) -> FinishedRequestStats:
    start = time.monotonic()
    tokens = tuple((index * 7 + i) % 5000 for i in range(64))
    return FinishedRequestStats(
        request_id=f"r{index}", finish_reason="length", stop_reason=None, arrival_time=start,
        queued_time=start, scheduled_time=start + 0.01, first_token_time=start + 0.05,
        last_token_time=start + 1.0, finished_time=start + 1.0, num_prompt_tokens=128,
        num_generation_tokens=len(tokens), num_cached_tokens=0, num_preemptions=0, max_tokens=64,
        sampling_params=SamplingParams(temperature=(index % 20) / 10, top_p=0.9, max_tokens=64),
        output_token_ids=tokens,
    )


def render_time(num_requests: int) -> tuple[float, int]:
    """Median seconds to render the registry, and its size in bytes, after ``num_requests`` were recorded."""
    from prometheus_client.exposition import generate_latest

    registry = CollectorRegistry()
    prometheus = PrometheusStatLogger(VigilMetrics("bench", registry))
    for first in range(0, num_requests, 100):
        finished = [synthetic_finished(i) for i in range(first, min(first + 100, num_requests))]
        prometheus.record(StepStats(
            timestamp=time.monotonic(), step_duration_s=0.02, num_running=64, num_waiting=0,
            num_kv_blocks_used=100, num_kv_blocks_total=1000, num_kv_slots_held=1600, num_kv_slots_filled=1560,
            num_scheduled_tokens=64, num_prefill_seqs=0,
            num_decode_seqs=64, num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
            num_prompt_tokens=0, num_generation_tokens=64, model_flops=17 * 10**9, finished=finished,
        ))
    timings = []
    for _ in range(20):
        started = time.perf_counter()
        body = generate_latest(registry)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), len(body)


class BuildTime:
    """A stats listener, registered first, that adds up the time the engine spent building each step's stats:
    the engine stamps ``StepStats.timestamp`` with ``time.monotonic()`` as it starts building them, and calls its
    listeners as soon as they are built."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, stats: StepStats) -> None:
        self.seconds += time.monotonic() - stats.timestamp


def run(args: argparse.Namespace) -> int:
    configure_logging("console", "WARNING")  # one request_finished line per request would drown the figures
    engine = build_engine(engine_config_from_args(args))
    telemetry = Telemetry(TelemetryConfig(model="bench"), CollectorRegistry())
    telemetry.attach(engine)
    engine.stats_listeners.clear()
    warm_up(engine, args)
    rates: dict[bool, list[float]] = {True: [], False: []}
    recording = Timed(telemetry.record)
    # The engine builds its stats objects only while someone listens: that share is telemetry's too.
    building = BuildTime()
    engine_seconds = 0.0
    for round_index in range(args.rounds):
        for telemetry_on in (True, False):
            # Fresh prompts every time, so that no side finds the other's in the prefix cache.
            seed = args.seed + 2 * round_index + telemetry_on
            prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, seed)
            if telemetry_on:
                engine.stats_listeners.extend((building, recording))
            result = time_engine(engine, prompts, args.output_len)
            rates[telemetry_on].append(result.tokens_per_second)
            engine_seconds += result.seconds if telemetry_on else 0.0
            engine.stats_listeners.clear()
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    seconds, size = render_time(10_000)
    print(f"\nbench telemetry: {args.num_prompts} requests x {args.output_len} output tokens, "
          f"{args.rounds} alternated rounds")
    print(f"telemetry on : {on:8.1f} output tok/s   (rounds: {', '.join(f'{r:.1f}' for r in rates[True])})")
    print(f"telemetry off: {off:8.1f} output tok/s   (rounds: {', '.join(f'{r:.1f}' for r in rates[False])})")
    print(f"overhead     : {100 * (off - on) / off:8.2f} %   (median against median; rounds vary with the machine)")
    spent = recording.seconds + building.seconds
    print(f"stats building + stat loggers on the engine thread: {spent / recording.calls * 1e6:.0f} us per step "
          f"({building.seconds / recording.calls * 1e6:.0f} + {recording.seconds / recording.calls * 1e6:.0f}), "
          f"{100 * spent / engine_seconds:.2f} % of the engine's time with telemetry on ({recording.calls} steps)")
    print(f"/metrics render with 10,000 finished requests recorded: {seconds * 1e3:.2f} ms, {size} bytes")
    return 0
