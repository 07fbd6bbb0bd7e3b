"""Hostile clients that hold connections for as long as a server lets them (the probe of issue 32): each sends the
start of a request and then one byte every few seconds, or under TLS never says hello, and opens a new connection
when the server closes its own. They run on an event loop of their own thread, from loopback addresses of their
own (all of 127.0.0.0/8 is loopback), so that a test's own requests come from another address."""

import asyncio
import contextlib
import ssl
import threading
import time
from dataclasses import dataclass

TRICKLE_EVERY_S = 3.0  # under uvicorn's 5 s keep-alive timer, which every byte restarts
REOPEN_AFTER_S = 1.0

SLOW_HEAD = "slow head"
UNAUTHENTICATED_BODY = "401 then a trickled body"
AUTHENTICATED_BODY = "authenticated, trickled body"
SILENT_TLS = "TLS without a ClientHello"


@dataclass
class Held:
    """One connection: the first line the server answered (empty if it closed without a word) and how long it
    stayed open."""

    kind: str
    source: str
    answer: bytes
    seconds: float


def _opening(kind: str, key: str, chunked: bool) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", "Host: 127.0.0.1"]
    if kind == SLOW_HEAD:
        return ("\r\n".join(lines) + "\r\nX-Slow: ").encode()
    if kind == AUTHENTICATED_BODY:
        lines.append(f"Authorization: Bearer {key}")
    lines += ["Content-Type: application/json", "Transfer-Encoding: chunked" if chunked else "Content-Length: 100000"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class ConnectionHolders:
    def __init__(self, port: int, kinds: list[str], sources: list[str], key: str,
                 tls: ssl.SSLContext | None = None) -> None:
        """One holder per entry of ``kinds``, their source addresses taken in turn from ``sources``."""
        self.port = port
        self.kinds = kinds
        self.sources = sources
        self.key = key
        self.tls = tls
        self.held: list[Held] = []
        self.open = 0
        self._loop = asyncio.new_event_loop()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),), daemon=True)

    def __enter__(self) -> "ConnectionHolders":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)  # type: ignore[union-attr]
        self._thread.join(60)

    async def _run(self) -> None:
        self._stopping = asyncio.Event()
        holders = [self._hold(index, kind) for index, kind in enumerate(self.kinds)]
        await asyncio.gather(*holders)

    async def _hold(self, index: int, kind: str) -> None:
        source = self.sources[index % len(self.sources)]
        while not self._stopping.is_set():  # type: ignore[union-attr]
            started = time.monotonic()
            answer = b""
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
                answer = await self._one_connection(kind, source, chunked=index % 2 == 1)
            self.held.append(Held(kind, source, answer, time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), REOPEN_AFTER_S)  # type: ignore[union-attr]

    async def _one_connection(self, kind: str, source: str, chunked: bool) -> bytes:
        tls = self.tls if kind != SILENT_TLS else None
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            "127.0.0.1", self.port, ssl=tls, server_hostname="127.0.0.1" if tls else None, local_addr=(source, 0)),
            30)
        self.open += 1
        received = b""
        try:
            if kind != SILENT_TLS:
                writer.write(_opening(kind, self.key, chunked))
            while not self._stopping.is_set():  # type: ignore[union-attr]
                try:
                    data = await asyncio.wait_for(reader.read(4096), TRICKLE_EVERY_S)
                except TimeoutError:
                    if kind != SILENT_TLS:
                        writer.write(b"1\r\n{\r\n" if chunked and kind != SLOW_HEAD else b"x")
                    continue
                if not data:
                    break
                received += data
        finally:
            self.open -= 1
            writer.transport.abort()
        return received.split(b"\r\n", 1)[0]
