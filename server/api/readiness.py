"""Is the engine alive, and is it really serving? Liveness reads the loop's health; readiness also proves an
idle engine with a one-token canary request, at most once per interval. ``keep_reporting`` keeps the server's
phase and readiness reported (as metrics) even when no orchestrator probes."""

import asyncio
import math
import time
from collections.abc import Callable

from server.api.lifecycle import Lifecycle
from server.engine.async_engine import AsyncEngine, EngineDeadError
from server.engine.request import INTERNAL_REQUEST_PREFIX, QueueFullError, SamplingParams

# A step running longer than this means the loop is stuck. CPU steps take well under a second.
STALLED_STEP_S = 60.0
CANARY_INTERVAL_S = 10.0
CANARY_TIMEOUT_S = 30.0
STATUS_REPORT_INTERVAL_S = 2.0


# The phase each readiness problem means (vigil_engine_phase); any other problem leaves the server serving, unready.
PHASE_OF_PROBLEM = {"loading": "loading", "warming_up": "warming_up", "draining": "draining", "engine_dead": "dead"}

StatusReport = Callable[[str, bool], None]


class ReadinessProbe:
    """Every readiness verdict also goes to ``report(phase, ready)``, so that what /readyz says and what the
    metrics say are the same verdict."""

    def __init__(
        self,
        engine: AsyncEngine,
        lifecycle: Lifecycle,
        report: StatusReport | None = None,
        interval: float = CANARY_INTERVAL_S,
        timeout: float = CANARY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._lifecycle = lifecycle
        self._report = report
        self._interval = interval
        self._timeout = timeout
        self._clock = clock
        self._proven_at = -math.inf
        self._canary: asyncio.Task[str | None] | None = None

    def liveness_problem(self) -> str | None:
        """None when the loop thread runs and is not stuck in a step (or still loads the model); else a short code
        saying why."""
        health = self._engine.health()
        if health.loading:
            return None
        if not health.alive:
            return "engine_dead"
        if health.step_started_at is not None and self._clock() - health.step_started_at > STALLED_STEP_S:
            return "engine_stalled"
        return None

    async def readiness_problem(self) -> str | None:
        problem = await self._readiness_problem()
        if self._report is not None:
            self._report(PHASE_OF_PROBLEM.get(problem or "", "serving"), problem is None)
        return problem

    async def _readiness_problem(self) -> str | None:
        if self._engine.loading:
            return "loading"
        if self._lifecycle.draining:
            return "draining"
        problem = self.liveness_problem()
        if problem is not None:
            return problem
        health = self._engine.health()
        if health.num_unfinished > 0:
            return None  # busy and stepping: the requests in flight are the proof
        last_proof = max(self._proven_at, health.last_step_at or -math.inf)
        if last_proof == -math.inf:
            return self._warm_up()
        if self._clock() - last_proof < self._interval:
            return None
        if self._canary is None or self._canary.done():
            self._canary = asyncio.create_task(self._run_canary())
        # Shielded: a probe that gives up must not cancel the canary that other probes share.
        return await asyncio.shield(self._canary)

    def _warm_up(self) -> str | None:
        """A loaded engine that has never run: its first canary warms it up, and probes say so instead of waiting
        on it. A failed warm-up is reported, and the next probe tries again."""
        if self._canary is None:
            self._canary = asyncio.create_task(self._run_canary())
        if not self._canary.done():
            return "warming_up"
        problem, self._canary = self._canary.result(), None
        return problem

    async def _run_canary(self) -> str | None:
        tokenizer = self._engine.tokenizer
        token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 0
        request = self._engine.make_request(
            self._engine.next_request_id(f"{INTERNAL_REQUEST_PREFIX}canary"), [token],
            SamplingParams(temperature=0.0, max_tokens=1),
        )
        try:
            async with asyncio.timeout(self._timeout):
                stream = await self._engine.add([request])
                try:
                    outputs = [output async for output in stream]
                finally:
                    stream.close()
        except TimeoutError:
            return "canary_timeout"
        except QueueFullError:
            return None  # the queue filled up since we looked: the engine is busy, not broken
        except EngineDeadError:
            return "engine_dead"
        if not outputs or not outputs[-1].outputs[0].token_ids:
            return "canary_failed"
        self._proven_at = self._clock()
        return None


class AllModelsReady:
    """The server's verdict over every served model's probe: alive while every engine is, ready while every one is
    (each model's phase and readiness are still reported on its own)."""

    def __init__(self, probes: list[ReadinessProbe]) -> None:
        self.probes = probes

    def liveness_problem(self) -> str | None:
        return next((p for p in (probe.liveness_problem() for probe in self.probes) if p is not None), None)

    async def readiness_problem(self) -> str | None:
        problems = await asyncio.gather(*(probe.readiness_problem() for probe in self.probes))
        return next((problem for problem in problems if problem is not None), None)


async def keep_reporting(probe: ReadinessProbe | AllModelsReady, interval: float = STATUS_REPORT_INTERVAL_S) -> None:
    """Ask for a readiness verdict every ``interval`` seconds, until cancelled, so that the reported status stays
    current (and an idle engine is proven by the canary) whether or not an orchestrator probes."""
    while True:
        await probe.readiness_problem()
        await asyncio.sleep(interval)
