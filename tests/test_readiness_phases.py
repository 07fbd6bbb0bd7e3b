"""/readyz says which phase a starting server is in: ``loading`` while the model loads, ``warming_up`` while a
loaded engine runs its first request (a one-token canary, which probes do not wait on), then ready; the phase
reported beside it agrees."""

import asyncio

from server.api.lifecycle import Lifecycle
from server.api.readiness import ReadinessProbe
from server.engine.async_engine import AsyncEngine


def test_a_loaded_engine_warms_up_before_it_is_ready(tiny_engine):
    reported: list[tuple[str, bool]] = []

    async def probe_until_ready() -> list[str | None]:
        engine = AsyncEngine(tiny_engine)
        engine.start(asyncio.get_running_loop())
        probe = ReadinessProbe(engine, Lifecycle(), lambda phase, ready: reported.append((phase, ready)))
        verdicts = [await probe.readiness_problem()]
        while verdicts[-1] is not None and len(verdicts) < 200:
            await asyncio.sleep(0.05)
            verdicts.append(await probe.readiness_problem())
        engine.stop()
        await asyncio.to_thread(engine.join, 30)
        return verdicts

    verdicts = asyncio.run(probe_until_ready())
    assert verdicts[0] == "warming_up" and verdicts[-1] is None
    assert set(verdicts[:-1]) == {"warming_up"}
    assert reported[0] == ("warming_up", False) and reported[-1] == ("serving", True)
