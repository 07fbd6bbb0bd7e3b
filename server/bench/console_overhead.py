"""``bench console``: HTTP throughput of a server without the live console (``--disable-console``) and of one with
it, open and refreshing, in alternating rounds; both servers run throughout, the idle one waiting.

"Open" is what a browser tab of /console asks of the server: data.json once a second, each time for the rows
after the last it got. This process polls, so the tab's own drawing is not on the machine, as a browser on the
operator's laptop would not be."""

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from server.bench.cpu_time import process_cpu_s
from server.bench.local_server import LocalServer
from server.bench.offline import Throughput, describe_engine, random_prompts
from server.bench.serve_http import READY_TIMEOUT_S, WARM_UP_TOKENS, time_clients, total
from server.engine.builder import build_engine
from server.engine_args import engine_config_from_args, engine_flags

POLL_S = 1.0
IDLE_S = 30.0


class ConsoleTab:
    """Polls /console/data.json as the page does, on a thread, until stopped; counts its polls."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.polls = 0
        self.ring_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ConsoleTab":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = None
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            while not self._stop.is_set():
                data = client.get("/console/data.json", params={} if last is None else {"since": last}).json()
                last = data["t"][-1] if data["t"] else last
                self.ring_bytes = data["ring"]["bytes"]
                self.polls += 1
                self._stop.wait(POLL_S)


@contextlib.contextmanager
def serving(args: argparse.Namespace, *extra: str) -> Iterator[LocalServer]:
    with tempfile.NamedTemporaryFile(prefix="vigil-bench-console-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    server = LocalServer([*engine_flags(engine_config_from_args(args)), *extra], log_path, env=dict(os.environ))
    try:
        yield server.wait_ready(READY_TIMEOUT_S)
    finally:
        server.stop()
        log_path.unlink()


def timed_round(server: LocalServer, prompts: list[list[int]], output_len: int) -> tuple[Throughput, float]:
    """The round's throughput, and the CPU seconds the server spent on it (all its threads)."""
    cpu_before = process_cpu_s(server.process.pid)
    served = asyncio.run(time_clients(server.base_url, prompts, output_len))
    return served, process_cpu_s(server.process.pid) - cpu_before


def idle_core_share(server: LocalServer, tab: bool) -> float:
    """The share of one core the server uses over IDLE_S seconds with no requests, a console tab open or not."""
    with ConsoleTab(server.base_url) if tab else contextlib.nullcontext():
        cpu_before, started = process_cpu_s(server.process.pid), time.monotonic()
        time.sleep(IDLE_S)
        return (process_cpu_s(server.process.pid) - cpu_before) / (time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engine = build_engine(engine_config_from_args(args))
    warm_up = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed - 1)
    no_console: list[Throughput] = []
    opened: list[Throughput] = []
    cpu_s = {"none": 0.0, "open": 0.0}
    polls, ring_bytes = 0, 0
    with serving(args, "--disable-console") as without, serving(args) as with_console:
        for server in (without, with_console):
            asyncio.run(time_clients(server.base_url, warm_up, WARM_UP_TOKENS))
        idle = {"no console": idle_core_share(without, tab=False),
                "console, no tab": idle_core_share(with_console, tab=False),
                "console, tab open": idle_core_share(with_console, tab=True)}
        for round_index in range(args.rounds):
            # Both sides take each round's prompts; which goes first alternates, so neither always runs warmer.
            prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed + round_index)
            first_open = round_index % 2 == 1
            for console_open in (first_open, not first_open):
                if console_open:
                    with ConsoleTab(with_console.base_url) as tab:
                        served, cpu = timed_round(with_console, prompts, args.output_len)
                    opened.append(served)
                    cpu_s["open"] += cpu
                    polls, ring_bytes = polls + tab.polls, tab.ring_bytes
                else:
                    served, cpu = timed_round(without, prompts, args.output_len)
                    no_console.append(served)
                    cpu_s["none"] += cpu
                time.sleep(0.5)
    print(f"\nbench console: {describe_engine(engine)}, {args.num_prompts} streaming clients, "
          f"{args.input_len} prompt tokens, {args.output_len} output tokens, greedy, ignore_eos")
    print(f"{'':12} {'no console tok/s':>21} {'console open tok/s':>19} {'open ÷ none':>14}")
    for index, (c, o) in enumerate(zip(no_console, opened, strict=True)):
        print(f"round {index + 1:<6} {c.tokens_per_second:21.1f} {o.tokens_per_second:19.1f} "
              f"{o.tokens_per_second / c.tokens_per_second:14.2%}")
    c, o = total("none", no_console), total("open", opened)
    print(f"{'all rounds':12} {c.tokens_per_second:21.1f} {o.tokens_per_second:19.1f} "
          f"{o.tokens_per_second / c.tokens_per_second:14.2%}")
    ratios = sorted(o.tokens_per_second / c.tokens_per_second for c, o in zip(no_console, opened, strict=True))
    print(f"median of the rounds' open ÷ none: {ratios[len(ratios) // 2]:.2%}")
    per_token = {side: seconds / total_run.output_tokens * 1e6
                 for (side, seconds), total_run in zip(cpu_s.items(), (c, o), strict=True)}
    print(f"server CPU per output token: no console {per_token['none']:.0f} µs, console open "
          f"{per_token['open']:.0f} µs ({per_token['open'] / per_token['none'] - 1:+.2%})")
    print("idle server, share of one core: " + ", ".join(f"{side} {share:.2%}" for side, share in idle.items()))
    print(f"console polls while open: {polls}; the ring: {ring_bytes / 2**20:.2f} MiB")
    return 0
