"""Pure ASGI middleware (never BaseHTTPMiddleware, which breaks client-disconnect detection).

Order, outermost first: request id, rate-limit headers, error boundary, size limits, authentication
(server/api/auth), admission.
"""

import logging
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.auth import RATE_LIMITED_TENANT_SCOPE_KEY
from server.api.errors import APIError, draining, loading, send_error
from server.api.lifecycle import Lifecycle
from server.api.rate_limits import RateLimiter

logger = logging.getLogger("vigil.api")

REQUEST_ID_SCOPE_KEY = "vigil.request_id"
_REQUEST_ID_HEADER = b"x-request-id"
_MAX_REQUEST_ID_LENGTH = 128


def request_id_of(scope: Scope) -> str:
    return scope.get(REQUEST_ID_SCOPE_KEY, "")


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == _REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            if 0 < len(text) <= _MAX_REQUEST_ID_LENGTH and text.isascii() and text.isprintable():
                return text
            return None
    return None


class RequestIdMiddleware:
    """Every response carries ``X-Request-Id``: the client's own (if sane), or a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        scope[REQUEST_ID_SCOPE_KEY] = request_id
        header = (_REQUEST_ID_HEADER, request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != _REQUEST_ID_HEADER]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class RateLimitHeadersMiddleware:
    """A rate-limited request's response carries its tenant's ``x-ratelimit-*`` headers, as they stand when the
    response starts (after the request's own admission and token reservation)."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.limiter.rpm is None and self.limiter.tpm is None:
            await self.app(scope, receive, send)
            return

        async def send_with_limits(message: Message) -> None:
            tenant = scope.get(RATE_LIMITED_TENANT_SCOPE_KEY)
            if message["type"] == "http.response.start" and tenant is not None:
                limits = [(name.encode(), value.encode()) for name, value in self.limiter.headers(tenant).items()]
                message = {**message, "headers": [*message.get("headers", []), *limits]}
            await send(message)

        await self.app(scope, receive, send_with_limits)


class ErrorBoundaryMiddleware:
    """An unexpected exception becomes an OpenAI-style 500 (with the request id) instead of a bare one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            logger.exception("unhandled error in %s %s (request id %s)",
                             scope["method"], scope["path"], request_id_of(scope))
            if started:
                raise
            await send_error(send, APIError(500, "internal server error", code="internal_error"))


class RequestLimitsMiddleware:
    """431 for oversized headers; 413 for a body over the limit, declared or streamed, and 400 for a body framed
    two ways (Content-Length and Transfer-Encoding: a proxy and this server could split such a stream into
    different requests). 413 and 400 close the connection, so that no unread body is taken for a request."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(name) + len(value) for name, value in scope["headers"]) > self.max_header_bytes:
            await send_error(send, APIError(431, f"request headers exceed {self.max_header_bytes} bytes",
                                            code="headers_too_large"))
            return
        names = [name for name, _ in scope["headers"]]
        if b"content-length" in names and b"transfer-encoding" in names:
            await send_error(send, APIError(400, "send Content-Length or Transfer-Encoding, not both",
                                            code="ambiguous_body_length", close_connection=True))
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await send_error(send, self._too_large())
            return
        body = _LimitedBody(receive, send, self.max_body_bytes, self._too_large())
        await self.app(scope, body.receive, body.send)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body exceeds {self.max_body_bytes} bytes", code="request_too_large",
                        close_connection=True)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class _LimitedBody:
    """Counts body bytes as they arrive. Past the limit it answers 413 itself, then tells the app that the
    client has gone (so that nothing downstream parses a truncated body) and drops whatever the app sends."""

    def __init__(self, receive: Receive, send: Send, limit: int, error: APIError) -> None:
        self._receive = receive
        self._send = send
        self._limit = limit
        self._error = error
        self._received = 0
        self._started = False
        self._rejected = False

    async def receive(self) -> Message:
        if self._rejected:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                self._rejected = True
                if not self._started:
                    self._started = True
                    await send_error(self._send, self._error)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self._rejected:
            return
        self._started = self._started or message["type"] == "http.response.start"
        await self._send(message)


class AdmissionMiddleware:
    """Counts requests in flight; while ``models_loading()`` or the server drains, new requests get 503 (health probes
    and /metrics pass through)."""

    def __init__(
        self, app: ASGIApp, lifecycle: Lifecycle, models_loading: Callable[[], bool], exempt_paths: frozenset[str]
    ) -> None:
        self.app = app
        self.lifecycle = lifecycle
        self.models_loading = models_loading
        self.exempt_paths = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        if self.lifecycle.draining or self.models_loading():
            await send_error(send, draining() if self.lifecycle.draining else loading())
            return
        with self.lifecycle.track():
            await self.app(scope, receive, send)
