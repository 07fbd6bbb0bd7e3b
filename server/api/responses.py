"""How the generation routes document their non-200 answers in the OpenAPI schema."""

from typing import Any

from server.api.protocol import ErrorResponse

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in [
        (400, "invalid request"),
        (401, "missing or invalid API key"),
        (404, "unknown model"),
        (413, "request body too large"),
        (429, "rate limit reached or queue full (see Retry-After)"),
        (500, "engine error"),
        (503, "not ready, draining, or the engine has failed"),
    ]
}

STREAM_RESPONSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
          "description": "with stream=true: server-sent events, ending with data: [DONE]"},
}
