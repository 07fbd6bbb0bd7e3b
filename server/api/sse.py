"""Server-sent events: ``data: <json>`` per chunk, an error event if the stream breaks, ``data: [DONE]`` last."""

from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from server.api.errors import APIError

DONE = b"data: [DONE]\n\n"


def event(chunk: BaseModel) -> bytes:
    return b"data: " + chunk.model_dump_json().encode() + b"\n\n"


def error_event(error: APIError) -> bytes:
    return b"data: " + error.body() + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """Streams events until the source ends or the client disconnects (Starlette listens for that and
    cancels the stream). ``cleanup`` runs either way, even if the source never started."""

    def __init__(self, events: AsyncIterator[bytes], cleanup: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._events = events
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cleanup()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
