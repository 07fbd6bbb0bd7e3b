"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status."""

import json
import logging
import math
import re
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Send

from server.engine.request import InvalidRequestError

logger = logging.getLogger("vigil.api")

# OpenAI's types: a client's fault is an invalid_request_error whatever its status (a bad key, an unknown model),
# a rate limit a rate_limit_error, and the server's fault a server_error. Clients branch on the status and `code`.
_TYPES = {429: "rate_limit_error"}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        close_connection: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after
        self.close_connection = close_connection

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    @property
    def headers(self) -> dict[str, str]:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        if self.close_connection:
            headers["Connection"] = "close"
        return headers

    def body(self) -> bytes:
        # ASCII-escaped, so that text echoed from a request (even a lone surrogate) always encodes.
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return json.dumps({"error": error}, ensure_ascii=True).encode()

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, headers=self.headers, media_type="application/json")


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_failed() -> APIError:
    return APIError(500, "engine error", code="engine_error")


def unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, code=code)


SHUTTING_DOWN = "the server is shutting down"
LOADING = "the model is still loading"
LOADING_RETRY_AFTER_S = 5.0


def draining() -> APIError:
    return unavailable(SHUTTING_DOWN, "draining")


def loading() -> APIError:
    return APIError(503, LOADING, code="loading", retry_after=LOADING_RETRY_AFTER_S)


async def send_error(send: Send, error: APIError) -> None:
    """Answer with ``error`` from pure ASGI code, before any response has started."""
    body = error.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(InvalidRequestError, _invalid_request)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_exception)


async def _api_error(request: Request, error: APIError) -> Response:
    return error.response()


async def _invalid_request(request: Request, error: InvalidRequestError) -> Response:
    return invalid_request(str(error), param=error.param, code=error.code).response()


async def _validation_error(request: Request, error: RequestValidationError) -> Response:
    """Wrong types and out-of-range values are the client's fault: 400, naming the first bad field.

    A field that takes several shapes (a string or a list of them, say) fails once per shape: the message is the
    failure of the shape the value had (a list too long), or, when it had none of them, the shapes it may take.
    """
    errors = error.errors()
    first = errors[0] if errors else {}
    location = _place(first)
    param = location[0] if location and not location[0].isdigit() else None
    message = first.get("msg", "invalid request").removeprefix("Value error, ").replace(" after validation", "")
    if first.get("type") == "json_invalid":
        message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
    elif location:
        shapes = [e for e in errors if _place(e)[:1] == location[:1] and _shape(e) is not None]
        if len(shapes) > 1:
            fitting = [e for e in shapes if not e["type"].endswith("_type")]
            if fitting:
                location = _place(fitting[0])
                message = fitting[0]["msg"].removeprefix("Value error, ").replace(" after validation", "")
            else:
                location = location[:1]
                message = "expected " + _either(dict.fromkeys(_describe(_shape(e)) for e in shapes))
        message = f"{'.'.join(location)}: {message}"
    return invalid_request(message, param=param).response()


def _place(error: dict) -> list[str]:
    location = [str(part) for part in error.get("loc", ()) if _names_a_place(part)]
    return location[1:] if location[:1] == ["body"] else location


def _shape(error: dict) -> str | None:
    """The union member a failure belongs to, as pydantic tags it (``list[int]``), if it belongs to one."""
    return next((str(part) for part in error.get("loc", ()) if "[" in str(part) or str(part) in _UNION_MEMBER_TAGS),
                None)


_NOUNS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object"}


def _describe(shape: str) -> str:
    """``list[list[int]]`` (with pydantic's validator wrappers) as "a list of lists of integers"."""
    base = re.search(r"(str|int|float|bool|dict)\]*$", shape)
    noun = _NOUNS.get(base.group(1) if base else "", "value")
    depth = shape.count("list[")
    if depth == 0:
        return ("an " if noun[0] in "aeiou" else "a ") + noun
    return "a list of " + "lists of " * (depth - 1) + noun + "s"


def _either(options: Iterable[str]) -> str:
    options = list(options)
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


# Pydantic names the union member or validator that failed inside a location; a client wants only the field.
_UNION_MEMBER_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _names_a_place(part: object) -> bool:
    if isinstance(part, int):
        return True
    text = str(part)
    return text.isidentifier() and text not in _UNION_MEMBER_TAGS


async def _http_exception(request: Request, error: HTTPException) -> Response:
    return APIError(error.status_code, str(error.detail)).response()
