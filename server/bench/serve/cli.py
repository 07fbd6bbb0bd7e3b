"""``bench serve``: builds the workload, runs it against each server in turn, then reports."""

import argparse
import logging
import math
import os
import sys
import time
from pathlib import Path

from server.bench.serve import plots
from server.bench.serve.client import ServerUnreachable, Target, first_model, normalize_base_url
from server.bench.serve.dataset import BenchRequest, jsonl_requests, load_tokenizer, random_requests
from server.bench.serve.report import Side, print_ratios, print_tables, ratios, write_json
from server.bench.serve.runner import RunResult, arrival_offsets, merge_runs, run_requests
from server.bench.serve.summary import SLO, parse_slo, summarize
from server.models.tokenizer import Tokenizer

Workload = tuple[list[BenchRequest], list[float]]  # requests and their arrival offsets


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    try:
        check_flags(args)
        slo = parse_slo(args.slo)
        targets = resolve_targets(args)
        tokenizer = load_tokenizer(args.tokenizer) if args.dataset == "random" else None
        workloads = [workload(args, tokenizer, round_index) for round_index in range(args.rounds)]
    except (ValueError, OSError, ServerUnreachable) as error:
        print(f"bench serve: {error}", file=sys.stderr)
        return 1
    runs: dict[str, list[RunResult]] = {label: [] for label in targets}
    for round_index, (requests, offsets) in enumerate(workloads):
        for label, target in targets.items():
            progress = f"round {round_index + 1}/{args.rounds} {label}"
            runs[label].append(run_requests(target, requests, offsets, args.max_concurrency, progress))
    sides = [side(label, target, merge_runs(runs[label]), slo) for label, target in targets.items()]
    report(args, sides)
    failed = [s.label for s in sides if s.summary.completed == 0]
    if failed:
        print(f"bench serve: every request to {' and '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


def check_flags(args: argparse.Namespace) -> None:
    if args.dataset == "jsonl" and not args.dataset_path:
        raise ValueError("--dataset jsonl needs --dataset-path")
    for flag in ("rounds", "num_prompts", "max_concurrency", "input_len", "output_len"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")


def resolve_targets(args: argparse.Namespace) -> dict[str, Target]:
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    targets = {"A": target(args.base_url, args.model, args, api_key, args.extra_body)}
    if args.compare:
        targets["B"] = target(args.compare, args.compare_model, args, api_key, args.compare_extra_body)
    return targets


def target(url: str, model: str | None, args: argparse.Namespace, api_key: str | None, extra_body: dict) -> Target:
    base_url = normalize_base_url(url)
    listed = first_model(base_url, api_key)  # also proves the server answers
    if (model or listed) is None:
        raise ValueError(f"{base_url} lists no model at /v1/models: pass the model name")
    return Target(base_url, model or listed, args.endpoint, api_key, args.ignore_eos, extra_body)


def workload(args: argparse.Namespace, tokenizer: Tokenizer | None, round_index: int) -> Workload:
    """Each round draws fresh random prompts and arrivals, so that no round finds the last one's prefixes
    cached; every server gets the same ones within a round."""
    seed = args.seed + round_index
    if args.dataset == "jsonl":
        requests = jsonl_requests(args.dataset_path, args.num_prompts, args.output_len, args.endpoint)
    else:
        requests = random_requests(tokenizer, args.num_prompts, args.input_len, args.output_len, seed)
    return requests, arrival_offsets(len(requests), args.request_rate, seed)


def side(label: str, target: Target, run: RunResult, slo: SLO | None) -> Side:
    return Side(label, target, run, summarize(run.records, run.duration_s, slo))


def report(args: argparse.Namespace, sides: list[Side]) -> None:
    ratio_table = ratios(sides[0].summary, sides[1].summary) if len(sides) == 2 else None
    result_json = Path(args.result_json or f"bench-results/serve-{time.strftime('%Y%m%d-%H%M%S')}.json")
    plot_dir = Path(args.plot_dir) if args.plot_dir else result_json.parent
    write_json(result_json, config(args), sides, ratio_table)
    runs = {s.label: s.run for s in sides}
    plots.latency_cdf(runs, plot_dir / f"{result_json.stem}-latency-cdf.png")
    plots.throughput_over_time(runs, plot_dir / f"{result_json.stem}-throughput.png")
    print_tables(sides)
    if ratio_table is not None:
        print_ratios(ratio_table)
    print(f"results: {result_json}; plots: {plot_dir / result_json.stem}-*.png")


def config(args: argparse.Namespace) -> dict:
    """The flags of the run, without the API key, and JSON-safe (no Infinity)."""
    values = {k: v for k, v in vars(args).items() if k not in ("func", "api_key", "command", "mode")}
    if math.isinf(values["request_rate"]):
        values["request_rate"] = "inf"
    return values
