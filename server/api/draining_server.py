"""uvicorn's server, but the first SIGTERM/SIGINT drains before uvicorn's own shutdown begins."""

import asyncio
import logging
from collections.abc import Sequence
from types import FrameType

import uvicorn

from server.api.lifecycle import Lifecycle
from server.engine.async_engine import AsyncEngine

logger = logging.getLogger("vigil.serve")


class DrainingServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, lifecycle: Lifecycle, engines: Sequence[AsyncEngine], shutdown_timeout: float
    ) -> None:
        super().__init__(config)
        self._lifecycle = lifecycle
        self.engines = engines
        self._shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets: list | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's handler: that one re-raises the signal after shutdown, so the exit code would not be 0.
        if self._lifecycle.draining or self._loop is None:
            self.should_exit = True
            self.force_exit = self._lifecycle.draining  # a second signal: stop now
            return
        self._lifecycle.begin_drain()
        # Signal handlers run between bytecodes of the loop's own thread: hand over through the self-pipe.
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        logger.info("draining: %d requests in flight, up to %.0fs", self._lifecycle.in_flight, self._shutdown_timeout)
        if not await self._lifecycle.wait_idle(self._shutdown_timeout):
            logger.warning("shutdown timeout: ending %d requests still in flight", self._lifecycle.in_flight)
            for engine in self.engines:
                engine.stop()
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if any(engine.load_error is not None for engine in self.engines):
            return True  # a model that cannot be served: exit, and let the caller report why
        return await super().on_tick(counter)
