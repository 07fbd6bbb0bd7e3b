"""``bench http``: the offline engine's throughput, then the same workload served by ``python -m server serve``
to concurrent streaming clients over 127.0.0.1, in one run; prints both and their ratio."""

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from server.bench.cpu_time import main_thread_cpu_s, process_cpu_s
from server.bench.local_server import LocalServer
from server.bench.offline import Throughput, describe_engine, random_prompts, time_engine
from server.bench.stream_client import post_stream
from server.engine.builder import build_engine
from server.engine_args import engine_config_from_args, engine_flags

READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 3600.0
# Warm-up runs the full batch (every prefill and decode shape of the timed rounds) for a few tokens: the first
# pass over new shapes is slow on the CPU, and it should fall on neither side.
WARM_UP_TOKENS = 4


async def stream_completion(base_url: str, prompt: list[int], output_len: int) -> int:
    """One streaming request; returns the completion tokens its final usage chunk reports."""
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    streamed = await post_stream(base_url, "/v1/completions", body)
    usage = streamed.last_json().get("usage") if streamed.done else None
    if usage is None:
        raise RuntimeError("a stream ended without its usage chunk and [DONE]")
    return usage["completion_tokens"]


async def time_clients(base_url: str, prompts: list[list[int]], output_len: int) -> Throughput:
    """All prompts at once, each from its own streaming client connection."""
    started = time.perf_counter()
    streams = asyncio.gather(*(stream_completion(base_url, p, output_len) for p in prompts))
    produced = await asyncio.wait_for(streams, REQUEST_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if any(count != output_len for count in produced):
        raise RuntimeError(f"expected {output_len} tokens from every stream, got {sorted(set(produced))}")
    return Throughput(f"HTTP, {len(prompts)} streaming clients", sum(produced), seconds)


@contextlib.contextmanager
def running_server(args: argparse.Namespace) -> Iterator[LocalServer]:
    """``python -m server serve`` with this run's engine flags on a free port."""
    with tempfile.NamedTemporaryFile(prefix="vigil-bench-http-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    server = LocalServer(engine_flags(engine_config_from_args(args)), log_path, env=dict(os.environ))
    try:
        server.wait_ready(READY_TIMEOUT_S)
        yield server
    except BaseException:
        print(f"server log kept in {log_path}", file=sys.stderr)
        raise
    else:
        log_path.unlink()
    finally:
        server.stop()


@dataclass
class CpuPerToken:
    """CPU microseconds per output token over the HTTP rounds: on two cores, the client's and the server's event
    loop's come out of the engine's share, so they say what HTTP costs."""

    client_s: float = 0.0
    server_loop_s: float = 0.0
    server_s: float = 0.0
    tokens: int = 0

    def add_round(self, server_pid: int, base_url: str, prompts: list[list[int]], output_len: int) -> Throughput:
        client, loop, whole = process_cpu_s(os.getpid()), main_thread_cpu_s(server_pid), process_cpu_s(server_pid)
        served = asyncio.run(time_clients(base_url, prompts, output_len))
        self.client_s += process_cpu_s(os.getpid()) - client
        self.server_loop_s += main_thread_cpu_s(server_pid) - loop
        self.server_s += process_cpu_s(server_pid) - whole
        self.tokens += served.output_tokens
        return served

    def line(self) -> str:
        def us(seconds: float) -> str:
            return f"{seconds / self.tokens * 1e6:.0f} µs"

        return (f"CPU per output token over HTTP: client {us(self.client_s)}, server event loop "
                f"{us(self.server_loop_s)}, server in all {us(self.server_s)}")


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
    cpu = CpuPerToken()
    with running_server(args) as server:
        asyncio.run(time_clients(server.base_url, warm_up, WARM_UP_TOKENS))
        for round_index in range(args.rounds):
            prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed + round_index)
            offline.append(time_engine(engine, prompts, args.output_len))
            served.append(cpu.add_round(server.process.pid, server.base_url, prompts, args.output_len))
    print(f"\nbench http: {describe_engine(engine)}, {args.num_prompts} requests, "
          f"{args.input_len} prompt tokens, {args.output_len} output tokens, greedy, ignore_eos")
    print(f"{'':12} {'offline tok/s':>14} {f'HTTP ({args.num_prompts} streams) tok/s':>26} {'HTTP ÷ offline':>15}")
    rows = [*((f"round {i + 1}", o, h) for i, (o, h) in enumerate(zip(offline, served, strict=True)))]
    if args.rounds > 1:
        rows.append(("all rounds", total("offline", offline), total("HTTP", served)))
    for label, o, h in rows:
        print(f"{label:12} {o.tokens_per_second:14.1f} {h.tokens_per_second:26.1f} "
              f"{h.tokens_per_second / o.tokens_per_second:15.1%}")
    print(cpu.line())
    return 0
