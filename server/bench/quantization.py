"""``bench quant``: the quantised engines against the unquantised one, alternated in one run: the single-stream
decode step set against its weight-read floor (the bytes each step reads of the weights, over a bandwidth measured
in the same run), output tokens per second at a batch, and what each costs in quality: the perplexity of the
model on a fixed public-domain text (server/bench/perplexity.py)."""

import argparse
import dataclasses
import math
import statistics

from server.bench.machine import this_machine
from server.bench.offline import describe_engine, random_prompts, time_engine, time_single_stream, weight_bytes_per_step
from server.bench.perplexity import text_perplexity
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine_args import engine_config_from_args


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    methods = [None, *args.methods.split(",")]
    engines = {method or "none": build_engine(dataclasses.replace(config, quantization=method)) for method in methods}
    base = engines["none"]
    prompts = random_prompts(args.batch, args.input_len, base.vocab_size, args.seed)
    for engine in engines.values():  # first passes over new shapes are slow on the CPU
        time_engine(engine, prompts[:2], 4)
    steps: dict[str, list[float]] = {name: [] for name in engines}
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            steps[name].append(time_single_stream(engine, prompts[0], args.output_len))
            rates[name].append(time_engine(engine, prompts, args.output_len).tokens_per_second)
    perplexities = {name: _perplexity(engine) for name, engine in engines.items()}
    machine = this_machine()
    bandwidth = machine.read_bandwidth_bytes_per_second
    print(f"\nmachine: {machine.describe()}")
    print(f"bench quant: {describe_engine(base)}; single stream and {args.batch} streams of {args.input_len} prompt "
          f"tokens, {args.output_len} output tokens, greedy, {args.rounds} alternated rounds (medians)")
    print(f"{'quantization':13} {'weights MB':>10} {'step ms':>8} {'floor ms':>9} {'x floor':>8} {'speed-up':>9} "
          f"{'batch tok/s':>12} {'batch x':>8} {'perplexity':>11}")
    base_step, base_rate = statistics.median(steps["none"]), statistics.median(rates["none"])
    for name, engine in engines.items():
        weights = weight_bytes_per_step(engine)
        step, rate = statistics.median(steps[name]), statistics.median(rates[name])
        floor = weights / bandwidth
        print(f"{name:13} {weights / 1e6:10.0f} {step * 1e3:8.2f} {floor * 1e3:9.2f} {step / floor:7.2f}x "
              f"{base_step / step:8.2f}x {rate:12.1f} {rate / base_rate:7.2f}x {perplexities[name]:11.3f}")
    return 0


def _perplexity(engine: LLMEngine) -> float:
    """NaN for a model whose context is shorter than the text."""
    try:
        return text_perplexity(engine)
    except ValueError:
        return math.nan
