"""``bench http``: the offline engine's throughput, then the same workload served by ``python -m server serve``
to concurrent streaming clients over 127.0.0.1, in one run; prints both and their ratio."""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from server.bench.local_server import LocalServer
from server.bench.offline import Throughput, describe_engine, random_prompts, time_engine
from server.engine.builder import build_engine
from server.engine_args import engine_config_from_args, engine_flags

READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 3600.0
# Warm-up runs the full batch (every prefill and decode shape of the timed rounds) for a few tokens: the first
# pass over new shapes is slow on the CPU, and it should fall on neither side.
WARM_UP_TOKENS = 4


async def stream_completion(client: httpx.AsyncClient, prompt: list[int], output_len: int) -> int:
    """One streaming request; returns the completion tokens its final usage chunk reports."""
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    usage = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            # Only the last chunk carries usage, and an error replaces it: the client stays light, so that it
            # takes as little CPU as it can from the server it measures.
            if line.startswith('data: {"error"'):
                raise RuntimeError(f"the server failed a request: {line}")
            if '"usage":{' in line:
                usage = json.loads(line.removeprefix("data: "))["usage"]
    if usage is None:
        raise RuntimeError("a stream ended without its usage chunk")
    return usage["completion_tokens"]


async def time_clients(base_url: str, prompts: list[list[int]], output_len: int) -> Throughput:
    """All prompts at once, each from its own streaming client connection."""
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        started = time.perf_counter()
        produced = await asyncio.gather(*(stream_completion(client, p, output_len) for p in prompts))
        seconds = time.perf_counter() - started
    if any(count != output_len for count in produced):
        raise RuntimeError(f"expected {output_len} tokens from every stream, got {sorted(set(produced))}")
    return Throughput(f"HTTP, {len(prompts)} streaming clients", sum(produced), seconds)


@contextlib.contextmanager
def running_server(args: argparse.Namespace) -> Iterator[str]:
    """``python -m server serve`` with this run's engine flags on a free port; yields its base URL."""
    with tempfile.NamedTemporaryFile(prefix="vigil-bench-http-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    server = LocalServer(engine_flags(engine_config_from_args(args)), log_path, env=dict(os.environ))
    try:
        server.wait_ready(READY_TIMEOUT_S)
        yield server.base_url
    except BaseException:
        print(f"server log kept in {log_path}", file=sys.stderr)
        raise
    else:
        log_path.unlink()
    finally:
        server.stop()


def total(label: str, results: list[Throughput]) -> Throughput:
    return Throughput(label, sum(r.output_tokens for r in results), sum(r.seconds for r in results))


def run(args: argparse.Namespace) -> int:
    """Rounds alternate the two sides, each round on fresh prompts (a cold prefix cache, as in bench offline),
    so that load from other processes on the machine falls on both alike."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    engine = build_engine(engine_config_from_args(args))
    warm_up = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed - 1)
    time_engine(engine, warm_up, WARM_UP_TOKENS)
    offline: list[Throughput] = []
    served: list[Throughput] = []
    with running_server(args) as base_url:
        asyncio.run(time_clients(base_url, warm_up, WARM_UP_TOKENS))
        for round_index in range(args.rounds):
            prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed + round_index)
            offline.append(time_engine(engine, prompts, args.output_len))
            served.append(asyncio.run(time_clients(base_url, prompts, args.output_len)))
    print(f"\nbench http: {describe_engine(engine)}, {args.num_prompts} requests, "
          f"{args.input_len} prompt tokens, {args.output_len} output tokens, greedy, ignore_eos")
    print(f"{'':12} {'offline tok/s':>14} {f'HTTP ({args.num_prompts} streams) tok/s':>26} {'HTTP ÷ offline':>15}")
    rows = [*((f"round {i + 1}", o, h) for i, (o, h) in enumerate(zip(offline, served, strict=True)))]
    if args.rounds > 1:
        rows.append(("all rounds", total("offline", offline), total("HTTP", served)))
    for label, o, h in rows:
        print(f"{label:12} {o.tokens_per_second:14.1f} {h.tokens_per_second:26.1f} "
              f"{h.tokens_per_second / o.tokens_per_second:15.1%}")
    return 0
