"""Authentication as pure ASGI middleware, so that a request is judged by its head before any of its body is
read or parsed."""

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.auth import CALLER_SCOPE_KEY
from server.api.auth.authenticator import Authenticator
from server.api.errors import APIError, send_error


class AuthMiddleware:
    """Every path but ``open_paths`` needs credentials (unknown paths included: they answer 401, not 404)."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, open_paths: frozenset[str]) -> None:
        self.app = app
        self.authenticator = authenticator
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        authorizations = [value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"]
        try:
            scope[CALLER_SCOPE_KEY] = await self.authenticator.identify(authorizations)
        except APIError as error:
            await send_error(send, error)
            return
        await self.app(scope, receive, send)
