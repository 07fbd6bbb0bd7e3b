"""``bench spec``: output tokens per second with and without n-gram speculation, on a repetitive workload (edit a
paragraph, refactor code: server/bench/spec_workloads.py), on random prompts (greedy, whose output loops) and on
random text (random prompts, sampled, whose output does not repeat), alternated in one run, with the
acceptance rate."""

import argparse
import dataclasses
import statistics

from server.bench.offline import describe_engine, random_prompts, time_engine
from server.bench.spec_workloads import RANDOM_TEXT_TEMPERATURE, REPETITIVE_PROMPTS
from server.config import SpeculativeConfig
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine.stats import StepStats
from server.engine_args import engine_config_from_args


def rate(engine: LLMEngine, prompts: list[list[int]], output_len: int, concurrency: int,
         temperature: float = 0.0) -> float:
    """Output tokens per second, ``concurrency`` requests at a time (greedy, or sampled at ``temperature``)."""
    tokens = seconds = 0.0
    for first in range(0, len(prompts), concurrency):
        result = time_engine(engine, prompts[first : first + concurrency], output_len, temperature)
        tokens += result.output_tokens
        seconds += result.seconds
    return tokens / seconds


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    # The engine flag --speculative-config, else n-gram speculation with its defaults.
    speculation = config.speculative_config or SpeculativeConfig()
    plain = build_engine(dataclasses.replace(config, speculative_config=None))
    speculative = build_engine(dataclasses.replace(config, speculative_config=speculation))
    encode = plain.tokenizer.encode
    count = len(REPETITIVE_PROMPTS) * args.repeats
    random = random_prompts(count, args.input_len, plain.vocab_size, args.seed)
    workloads = {  # name: prompts, temperature
        "repetitive": ([encode(p) for p in REPETITIVE_PROMPTS] * args.repeats, 0.0),
        "random": (random, 0.0),
        "random text": (random, RANDOM_TEXT_TEMPERATURE),
    }
    for engine in (plain, speculative):  # first passes over new shapes are slow on the CPU
        rate(engine, random[: args.concurrency], 8, args.concurrency)
    steps: list[StepStats] = []
    speculative.stats_listeners.append(steps.append)
    print(f"\nbench spec: {describe_engine(plain)}, n-gram speculation {speculation.to_json()}, "
          f"{args.output_len} output tokens, greedy (random text at temperature {RANDOM_TEXT_TEMPERATURE}), "
          f"{args.concurrency} at a time, {args.rounds} alternated rounds")
    print(f"{'workload':12} {'plain tok/s':>12} {'speculative tok/s':>18} {'speedup':>8} {'accepted':>9} "
          f"{'kept/step':>10}")
    for name, (prompts, temperature) in workloads.items():
        plain_rates, speculative_rates = [], []
        steps.clear()
        for _ in range(args.rounds):
            plain_rates.append(rate(plain, prompts, args.output_len, args.concurrency, temperature))
            speculative_rates.append(rate(speculative, prompts, args.output_len, args.concurrency, temperature))
        drafted = sum(s.num_draft_tokens for s in steps)
        accepted = sum(s.num_accepted_tokens for s in steps)
        lengths = [length for s in steps for length in s.accepted_lengths]
        base, faster = statistics.median(plain_rates), statistics.median(speculative_rates)
        print(f"{name:12} {base:12.1f} {faster:18.1f} {faster / base:7.2f}x "
              f"{accepted / drafted if drafted else 0:9.1%} {statistics.mean(lengths) if lengths else 0:10.2f}")
    return 0
