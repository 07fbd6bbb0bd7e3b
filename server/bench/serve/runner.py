"""Sends a run's requests on their arrival schedule under a concurrency cap, with a progress bar."""

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass

import httpx
import numpy as np
from tqdm import tqdm

from server.bench.serve.client import REQUEST_TIMEOUT_S, RequestRecord, Target, send
from server.bench.serve.dataset import BenchRequest

REQUEST_TIMEOUT = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)


@dataclass
class RunResult:
    records: list[RequestRecord]
    duration_s: float


def arrival_offsets(num: int, rate: float, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent: a Poisson process (exponential gaps) at ``rate``
    requests per second, or all at once for an infinite rate."""
    if math.isinf(rate):
        return [0.0] * num
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num)
    return (np.cumsum(gaps) - gaps[0]).tolist()  # the first request goes at once


def run_requests(target: Target, requests: list[BenchRequest], offsets: list[float], max_concurrency: int | None,
                 label: str) -> RunResult:
    return asyncio.run(_run(target, requests, offsets, max_concurrency, label))


async def _run(target: Target, requests: list[BenchRequest], offsets: list[float], max_concurrency: int | None,
               label: str) -> RunResult:
    slots = max_concurrency or len(requests)
    semaphore = asyncio.Semaphore(slots)
    limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
    progress = tqdm(total=len(requests), desc=label, unit="req")
    async with httpx.AsyncClient(base_url=target.base_url, timeout=REQUEST_TIMEOUT, limits=limits) as client:
        started = time.perf_counter()

        async def one(index: int) -> RequestRecord:
            await asyncio.sleep(offsets[index] - (time.perf_counter() - started))
            async with semaphore:
                record = await send(client, target, requests[index], index, started)
            progress.update()
            return record

        records = await asyncio.gather(*(one(i) for i in range(len(requests))))
        duration = time.perf_counter() - started
    progress.close()
    return RunResult(list(records), duration)


def merge_runs(runs: list[RunResult]) -> RunResult:
    """Rounds laid end to end: each round's start times shift by the durations before it."""
    records: list[RequestRecord] = []
    elapsed = 0.0
    for run in runs:
        records += [dataclasses.replace(r, start_s=r.start_s + elapsed) for r in run.records]
        elapsed += run.duration_s
    return RunResult(records, elapsed)
