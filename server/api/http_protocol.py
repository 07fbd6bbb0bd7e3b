"""uvicorn's h11 protocol with the two limits a server facing the public needs, which uvicorn lacks:

- a request head must arrive in full within ``header_timeout_s`` of the connection opening or of the previous
  response ending, else 408 and the connection closes (a slowloris client holds nothing for long);
- at most ``max_connections`` connections at once; one more gets 503 and is closed at once.
"""

import asyncio
import json
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def _refusal(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP response that closes the connection, written without h11 (which cannot answer a request it
    has not received)."""
    error = {"message": message, "type": "invalid_request_error" if status < 500 else "service_unavailable",
             "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0
    max_connections: int = 1024

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(_refusal(503, "Service Unavailable", f"more than {self.max_connections} connections are "
                                  "open; retry later", "too_many_connections"))
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        # A pipelined request may already have been read; only a connection waiting for a head needs the timer.
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _head_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse(_refusal(408, "Request Timeout", f"no complete request head within "
                                  f"{self.header_timeout_s:g} seconds", "request_timeout"))

    def _refuse(self, response: bytes) -> None:
        self.transport.write(response)
        self.transport.close()


def guarded_h11_protocol(header_timeout_s: float, max_connections: int) -> Callable[..., GuardedH11Protocol]:
    """The protocol class uvicorn's ``http=`` takes, with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout_s": header_timeout_s, "max_connections": max_connections})
