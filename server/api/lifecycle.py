"""Draining: once a shutdown starts, admit nothing new and wait for the requests in flight."""

import asyncio
import contextlib
from collections.abc import Iterator


class Lifecycle:
    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def begin_drain(self) -> None:
        self.draining = True

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count one request in flight for the duration of the block."""
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True once nothing is in flight; False if ``timeout`` seconds pass first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
