"""``bench e2e``: each cell's two servers started, warmed, alternated over the rounds, stopped; then the table."""

import argparse
import dataclasses
import itertools
import json
import logging
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from server.bench.end_to_end.cells import Cell, Peer, Workload, table_cells
from server.bench.end_to_end.servers import Launch, missing, running
from server.bench.machine import this_machine
from server.bench.serve.client import ServerUnreachable, Target, first_model
from server.bench.serve.dataset import BenchRequest, load_tokenizer, random_requests
from server.bench.serve.runner import RunResult, arrival_offsets, merge_runs, run_requests
from server.bench.serve.summary import Summary, summarize
from server.bench.spec_workloads import RANDOM_TEXT_TEMPERATURE, REPETITIVE_PROMPTS
from server.config import SpeculativeConfig
from server.models.loader import default_model_path
from server.models.tokenizer import Tokenizer

# A fresh server's first passes over new shapes are slow on the CPU: each one serves this many tokens a request
# to as many requests as the cell's concurrency before the rounds.
WARM_UP_TOKENS = 16
# llama-server's context a slot: at least this, and room for the prompt, the output and bench spec's longer prompts.
LEAST_SLOT_CONTEXT, SLOT_CONTEXT_MARGIN = 1024, 256


@dataclass
class CellResult:
    cell: Cell
    commands: dict[str, list[str]]  # "A", "B": each server's command line
    summaries: dict[str, Summary]
    skipped: str | None = None  # what the run lacked to start a server
    failure: str | None = None
    round_ratios: list[float] = dataclasses.field(default_factory=list)  # A ÷ B each round: the noise

    @property
    def ratio(self) -> float | None:
        if self.skipped or self.failure:
            return None
        return throughput_ratio(self.summaries["A"], self.summaries["B"])


def throughput_ratio(a: Summary, b: Summary) -> float | None:
    """A ÷ B in output tokens/s; None where B gave none."""
    return a.output_throughput / b.output_throughput if b.output_throughput else None


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result_json = args.result_json or Path(f"bench-results/e2e-{time.strftime('%Y%m%d-%H%M%S')}.json")
    log_dir = result_json.with_name(f"{result_json.stem}-logs")
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        ggufs = {Peer.Q4_1: args.q4_gguf or default_model_path()}
    except OSError as error:
        print(f"bench e2e: {error}", file=sys.stderr)
        return 2
    if args.bf16_gguf:
        ggufs[Peer.BF16] = args.bf16_gguf
    slot_context = max(LEAST_SLOT_CONTEXT, args.input_len + args.output_len + SLOT_CONTEXT_MARGIN)
    launch = Launch(log_dir, ("--max-num-seqs", str(args.max_num_seqs), *args.vigil_args), args.max_num_seqs,
                    slot_context, len(os.sched_getaffinity(0)), args.llama_server, tuple(args.llama_args), ggufs)
    speculative_config = args.speculative_config or SpeculativeConfig().to_json()
    tokenizer = load_tokenizer(None)
    machine = this_machine().describe()
    print(f"bench e2e on {machine}\n{args.input_len}-token prompts, {args.output_len} output tokens, {args.rounds} "
          f"alternated rounds a cell")
    results = []
    for cell in table_cells(args.cells, args.concurrency, speculative_config):
        result = run_cell(cell, launch, args, tokenizer)
        results.append(result)
        print(row(result), flush=True)
    print_table(results)
    write_json(result_json, machine, args, results)
    print(f"results: {result_json}; server logs: {log_dir}")
    return 1 if any(r.failure for r in results) else 0


def run_cell(cell: Cell, launch: Launch, args: argparse.Namespace, tokenizer: Tokenizer) -> CellResult:
    result = CellResult(cell, {}, {})
    lacking = missing(cell.a, launch) or missing(cell.b, launch)
    if lacking:
        result.skipped = lacking
        return result
    name = f"c{cell.concurrency}-{cell.key}"
    try:
        with (running(cell.a, launch, f"{name}-A") as (url_a, command_a),
              running(cell.b, launch, f"{name}-B") as (url_b, command_b)):
            result.commands = {"A": command_a, "B": command_b}
            targets = {"A": target(url_a, cell.workload), "B": target(url_b, cell.workload)}
            result.summaries, result.round_ratios = measure(cell, targets, args, tokenizer)
    except (RuntimeError, TimeoutError, ServerUnreachable, OSError) as error:
        result.failure = f"{str(error).splitlines()[0]} (logs: {launch.log_dir / name}-A.log and -B.log)"
        return result
    failed = {label: s.failed for label, s in result.summaries.items() if s.failed}
    if failed:
        result.failure = ", ".join(f"{count} requests to {label}" for label, count in failed.items())
    return result


def target(base_url: str, workload: Workload) -> Target:
    extra_body = {"temperature": RANDOM_TEXT_TEMPERATURE} if workload is Workload.RANDOM_TEXT else {}
    return Target(base_url, first_model(base_url, None) or "default", "completions", None, True, extra_body)


def measure(cell: Cell, targets: dict[str, Target], args: argparse.Namespace,
            tokenizer: Tokenizer) -> tuple[dict[str, Summary], list[float]]:
    """Both servers' summaries over every round, and A ÷ B in output tokens/s round by round."""
    count = args.num_prompts or max(8, 4 * cell.concurrency)
    # A seed no round draws.
    warm_up = random_requests(tokenizer, cell.concurrency, args.input_len, WARM_UP_TOKENS, args.seed + args.rounds)
    for label, server in targets.items():
        run_requests(server, warm_up, arrival_offsets(len(warm_up), float("inf"), 0), cell.concurrency,
                     f"{cell.title}: warm-up {label}")
    runs: dict[str, list[RunResult]] = {label: [] for label in targets}
    for round_index in range(args.rounds):
        requests = workload_requests(cell.workload, tokenizer, count, args, args.seed + round_index)
        offsets = arrival_offsets(count, float("inf"), 0)
        for label, server in targets.items():
            progress = f"{cell.title}: round {round_index + 1}/{args.rounds} {label}"
            runs[label].append(run_requests(server, requests, offsets, cell.concurrency, progress))
    summaries = {label: summarize(merged.records, merged.duration_s, None)
                 for label, merged in ((label, merge_runs(r)) for label, r in runs.items())}
    round_ratios = (throughput_ratio(*(summarize(run.records, run.duration_s, None) for run in pair))
                    for pair in zip(runs["A"], runs["B"], strict=True))
    return summaries, [ratio for ratio in round_ratios if ratio is not None]


def workload_requests(workload: Workload, tokenizer: Tokenizer, count: int, args: argparse.Namespace,
                      seed: int) -> list[BenchRequest]:
    """Fresh random prompts each round, so that no round finds the last one's prefixes cached; the repetitive
    prompts in turn."""
    if workload is Workload.REPETITIVE:
        prompts = itertools.islice(itertools.cycle(REPETITIVE_PROMPTS), count)
        return [BenchRequest(args.output_len, prompt=prompt) for prompt in prompts]
    return random_requests(tokenizer, count, args.input_len, args.output_len, seed)


COLUMNS = ("A ÷ B", "output tok/s", "median TTFT, A against B", "mean TPOT, A against B")


def row(result: CellResult) -> str:
    if result.skipped or result.failure:
        outcome = f"not run: {result.skipped}" if result.skipped else f"failed: {result.failure}"
        return f"| {result.cell.title} | {outcome} | | |"
    a, b = result.summaries["A"], result.summaries["B"]
    return (f"| {result.cell.title} | {a.output_throughput:.1f} / {b.output_throughput:.1f} = "
            f"**{result.ratio:.2f}×**{spread(result.round_ratios)} | {milliseconds(a, 'ttft', 'median')} against "
            f"{milliseconds(b, 'ttft', 'median')} ms | {milliseconds(a, 'tpot', 'mean', 2)} against "
            f"{milliseconds(b, 'tpot', 'mean', 2)} ms |")


def spread(round_ratios: list[float]) -> str:
    return f" (rounds {min(round_ratios):.2f}-{max(round_ratios):.2f}×)" if len(round_ratios) > 1 else ""


def milliseconds(summary: Summary, field: str, stat: str, digits: int = 0) -> str:
    distribution = getattr(summary, field)
    return "-" if distribution is None else f"{getattr(distribution, stat):.{digits}f}"


def print_table(results: list[CellResult]) -> None:
    print(f"\n| {' | '.join(COLUMNS)} |\n|{' --- |' * len(COLUMNS)}")
    for result in results:
        print(row(result))
    print(f"\ncommand: {shlex.join([Path(sys.executable).name, '-m', 'server', *sys.argv[1:]])}")


def write_json(path: Path, machine: str, args: argparse.Namespace, results: list[CellResult]) -> None:
    config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()
              if key not in ("func", "command", "mode")}
    cells = [{"key": r.cell.key, "title": r.cell.title, "concurrency": r.cell.concurrency,
              "workload": r.cell.workload.value, "a": r.cell.a.name, "b": r.cell.b.name, "ratio": r.ratio,
              "round_ratios": r.round_ratios, "skipped": r.skipped, "failure": r.failure, "commands": r.commands,
              "summaries": {label: dataclasses.asdict(s) for label, s in r.summaries.items()}}
             for r in results]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "config": config, "cells": cells}, indent=2) + "\n")
