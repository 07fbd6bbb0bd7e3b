"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right status."""

import json
import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Send

from server.engine.request import InvalidRequestError

logger = logging.getLogger("vigil.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    @property
    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}

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
    return invalid_request(str(error), param=error.param).response()


async def _validation_error(request: Request, error: RequestValidationError) -> Response:
    """Wrong types and out-of-range values are the client's fault: 400, naming the first bad field."""
    first = error.errors()[0] if error.errors() else {}
    location = [str(part) for part in first.get("loc", ()) if _names_a_place(part)]
    if location[:1] == ["body"]:
        location = location[1:]
    param = location[0] if location and not location[0].isdigit() else None
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        message = f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
    elif location:
        message = f"{'.'.join(location)}: {message}"
    return invalid_request(message, param=param).response()


# Pydantic names the union member or validator that failed inside a location; a client wants only the field.
_UNION_MEMBER_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _names_a_place(part: object) -> bool:
    if isinstance(part, int):
        return True
    text = str(part)
    return text.isidentifier() and text not in _UNION_MEMBER_TAGS


async def _http_exception(request: Request, error: HTTPException) -> Response:
    return APIError(error.status_code, str(error.detail)).response()
