"""uvicorn's h11 protocol with the limits a server facing the public needs, which uvicorn lacks:

- a request head must arrive in full within ``header_timeout_s`` of the connection opening or of the previous
  response ending, else 408 and the connection closes (a slowloris client holds nothing for long);
- a request body must arrive in full within ``body_timeout_s`` of its head, else 408 (if no response has begun),
  the connection closes and the handler hears that the client has gone;
- a response given before the request's body has arrived (a 401, say) carries ``Connection: close`` and the
  connection closes, instead of waiting for a body nobody will read;
- the connection caps of ``limits`` (in all and per client address); one more gets 503 and is closed at once.
  Under TLS the TLS layer beneath counts connections (server/api/tls_handshake.py), and ``limits`` is None;
- a head h11 cannot parse (or too large to buffer) gets an OpenAI-style JSON 400 rather than uvicorn's text.

Every refusal closes lingering, as nginx does: the response is written and the sending side shut, then what the
client is still sending is read and dropped for up to ``LINGER_S``. Closed at once with unread input, the socket
would answer with a reset, and the client would see that instead of the refusal.
"""

import asyncio
import json
from collections.abc import Callable

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.api.connection_limits import ConnectionLimits, client_address

LINGER_S = 2.0


def _refusal(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP response that closes the connection, written without h11 (which cannot answer a request it
    has not received)."""
    error = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
             "param": None, "code": code}
    body = json.dumps({"error": error}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + body


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


class GuardedH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    limits: ConnectionLimits | None = None

    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _admitted_client: str | None = None
    _linger_timer: asyncio.TimerHandle | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.app = self._closing_after_unread_body(self.app)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.limits is not None:
            client = client_address(transport)
            refusal = self.limits.admit(client)
            if refusal is not None:
                self._refuse(_refusal(503, "Service Unavailable", refusal.message, refusal.code))
                return
            self._admitted_client = client
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()
        self._watch_body()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()
        self._watch_body()  # a pipelined request may have begun

    def eof_received(self) -> bool | None:
        if self._linger_timer is not None:
            self.transport.close()
            return None
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self._cancel_body_timer()
        self._linger_timer = _cancelled(self._linger_timer)
        if self.limits is not None and self._admitted_client is not None:
            self.limits.release(self._admitted_client)
            self._admitted_client = None
        super().connection_lost(exc)

    def _closing_after_unread_body(self, app: ASGIApp) -> ASGIApp:
        async def app_closing_after_unread_body(scope: Scope, receive: Receive, send: Send) -> None:
            async def send_closing(message: Message) -> None:
                headers = message.get("headers", [])
                if (message["type"] == "http.response.start" and self.conn.their_state is h11.SEND_BODY
                        and CLOSE_HEADER not in headers):
                    message = {**message, "headers": [*headers, CLOSE_HEADER]}
                await send(message)

            await app(scope, receive, send_closing)

        return app_closing_after_unread_body

    def _watch_body(self) -> None:
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            self._cancel_body_timer()
        elif self._body_timer is None:
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timed_out)

    def _cancel_body_timer(self) -> None:
        self._body_timer = _cancelled(self._body_timer)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            # The handler's next receive() says the client has gone, and whatever it sends is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            self._refuse(_refusal(408, "Request Timeout", f"the request body did not arrive within "
                                  f"{self.body_timeout_s:g} seconds", "request_timeout"))
        else:
            self.transport.close()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        # A pipelined request may already have been read; only a connection waiting for a head needs the timer.
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_header_timer(self) -> None:
        self._header_timer = _cancelled(self._header_timer)

    def _head_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse(_refusal(408, "Request Timeout", f"no complete request head within "
                                  f"{self.header_timeout_s:g} seconds", "request_timeout"))

    def send_400_response(self, msg: str) -> None:
        self._refuse(_refusal(400, "Bad Request", "the request head is malformed or too large", "invalid_request"))

    def _refuse(self, response: bytes) -> None:
        self.transport.write(response)
        self._cancel_header_timer()
        self._cancel_body_timer()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)


def guarded_h11_protocol(
    header_timeout_s: float, body_timeout_s: float, limits: ConnectionLimits | None
) -> Callable[..., GuardedH11Protocol]:
    """The protocol class uvicorn's ``http=`` takes, with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "limits": limits})
