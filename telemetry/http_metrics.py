"""Pure ASGI middleware counting HTTP responses by route template and code, and failures by reason."""

import json
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http_status import CLIENT_CLOSED_REQUEST
from telemetry.metrics import VigilMetrics

MAX_ERROR_BODY_BYTES = 4096


def error_reason(status: int, code: str | None) -> str | None:
    """The ``vigil_request_errors_total`` reason for an error response, or None for a success."""
    if status < 400:
        return None
    if status == 401:
        return "unauthorized"
    if status in (413, 431):
        return "payload_too_large"
    if status == 429:
        return "queue_full" if code == "queue_full" else "rate_limited"
    if status == 503:
        return "not_ready"
    if status >= 500:
        return "engine"
    return "validation"


class HttpMetricsMiddleware:
    """Outermost middleware: sees every response, including those that inner middleware answer alone (a 401, a
    413) before any routing. So the route label comes from matching the path against ``routes``, (template,
    compiled pattern) pairs; unknown paths are ``other``, which keeps the label set closed."""

    def __init__(self, app: ASGIApp, metrics: VigilMetrics, routes: Sequence[tuple[str, re.Pattern]]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        error_body = b""

        async def observe(message: Message) -> None:
            nonlocal status, error_body
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400:
                error_body = (error_body + message.get("body", b""))[:MAX_ERROR_BODY_BYTES]
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self._record(scope, status, error_body)

    def _record(self, scope: Scope, status: int, error_body: bytes) -> None:
        template = next((template for template, pattern in self.routes if pattern.match(scope["path"])), "other")
        # No response started: the client went away first (nginx's 499).
        status = status or CLIENT_CLOSED_REQUEST
        self.metrics.http_requests.labels(template, str(status)).inc()
        # Disconnects are counted where they are known for sure: by the generation that lost its client.
        reason = None if status == CLIENT_CLOSED_REQUEST else error_reason(status, _error_code(error_body))
        if reason is not None:
            self.metrics.request_errors.labels(reason).inc()


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None
