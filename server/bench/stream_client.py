"""A lean HTTP/1.1 client for one streamed completion, for load generation on the machine under test.

``bench http`` runs its clients on the cores the server uses, so every microsecond the client spends per token
is taken from the server it measures. httpx (with its h11 parser, anyio streams and line decoder) took about
90 µs of CPU per streamed token on a 2-core Xeon; this client parses the chunked body in ``data_received`` with
no task switch per chunk. It speaks just enough HTTP for that job: one request per connection, a chunked or
sized response body, and server-sent events split on blank lines.
"""

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

HEAD_END = b"\r\n\r\n"
CRLF = b"\r\n"
EVENT_END = b"\n\n"
DATA_PREFIX = b"data: "
DONE = b"data: [DONE]"
MAX_HEAD_BYTES = 64 * 1024


class StreamError(Exception):
    """The server answered with an error status, sent an error event, or broke the HTTP framing."""


class ErrorStatus(StreamError):
    """The server answered with a status other than 200; ``body`` is what it sent with it."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body.decode(errors='replace')}")
        self.status = status
        self.body = body


@dataclass
class StreamedEvents:
    """What one streamed response held: its ``data:`` events (without ``[DONE]``) and whether ``[DONE]`` came."""

    status: int
    events: list[bytes] = field(default_factory=list)
    done: bool = False

    def last_json(self) -> dict:
        if not self.events:
            raise StreamError("the stream held no events")
        return json.loads(self.events[-1].removeprefix(DATA_PREFIX))


# Called with each ``data:`` event (its bytes, without the prefix) as it arrives; may raise StreamError to end
# the stream.
EventListener = Callable[[bytes], None]


class EventStreamReader(asyncio.Protocol):
    def __init__(self, request: bytes, finished: asyncio.Future[StreamedEvents],
                 on_event: EventListener | None = None) -> None:
        self._request = request
        self._finished = finished
        self._on_event = on_event
        self._buffer = bytearray()
        self._body = bytearray()
        self._status = 0
        self._chunked = False
        self._length: int | None = None
        self._in_head = True
        self._result: StreamedEvents | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            if self._in_head and not self._read_head():
                return
            self._read_body()
        except StreamError as error:
            self._fail(error)

    def eof_received(self) -> bool | None:
        if not self._chunked and self._length is None and not self._in_head:
            self._body += self._buffer  # a body delimited by the connection's end
            self._buffer.clear()
            self._complete()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._finished.done():
            self._finished.set_exception(StreamError(f"the connection closed mid-response ({exc or 'EOF'})"))

    def _read_head(self) -> bool:
        end = self._buffer.find(HEAD_END)
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise StreamError("the response head is too long")
            return False
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[: end + len(HEAD_END)]
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise StreamError(f"not an HTTP/1.x status line: {lines[0]!r}")
        self._status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip()
            if name == "transfer-encoding" and value.lower() == "chunked":
                self._chunked = True
            elif name == "content-length":
                self._length = int(value)
        self._in_head = False
        return True

    def _read_body(self) -> None:
        if not self._chunked:
            if self._length is not None and len(self._buffer) >= self._length:
                self._body += self._buffer[: self._length]
                self._buffer.clear()
                self._complete()
            return
        while True:
            size_end = self._buffer.find(CRLF)
            if size_end < 0:
                return
            try:
                size = int(self._buffer[:size_end].split(b";", 1)[0], 16)
            except ValueError:
                raise StreamError(f"a bad chunk size line: {bytes(self._buffer[:size_end])!r}") from None
            if size == 0:
                self._complete()  # trailers, if any, are not read: the connection closes
                return
            chunk_end = size_end + len(CRLF) + size
            if len(self._buffer) < chunk_end + len(CRLF):
                return
            self._body += self._buffer[size_end + len(CRLF): chunk_end]
            del self._buffer[: chunk_end + len(CRLF)]
            if self._status == 200:
                self._take_events()

    def _take_events(self) -> None:
        if self._result is None:
            self._result = StreamedEvents(self._status)
        while (end := self._body.find(EVENT_END)) >= 0:
            event = bytes(self._body[:end])
            del self._body[: end + len(EVENT_END)]
            if event == DONE:
                self._result.done = True
                continue
            if self._on_event is not None and event.startswith(DATA_PREFIX):
                self._on_event(event.removeprefix(DATA_PREFIX))
            if event.startswith(b'data: {"error"'):
                raise StreamError(f"the server failed the stream: {event.decode(errors='replace')}")
            elif event.startswith(DATA_PREFIX):
                self._result.events.append(event)

    def _complete(self) -> None:
        if self._status != 200:
            self._fail(ErrorStatus(self._status, bytes(self._body)))
            return
        self._take_events()
        assert self._result is not None
        if not self._finished.done():
            self._finished.set_result(self._result)
        self._close()

    def _fail(self, error: StreamError) -> None:
        if not self._finished.done():
            self._finished.set_exception(error)
        self._close()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def post_stream(base_url: str, path: str, body: dict, headers: dict[str, str] | None = None,
                      on_event: EventListener | None = None) -> StreamedEvents:
    """POST ``body`` as JSON to ``base_url`` + ``path`` (plain http) with any extra ``headers``, and read the whole
    event stream."""
    url = urlsplit(base_url)
    if url.scheme != "http" or url.hostname is None:
        raise ValueError(f"an http:// base URL is needed, not {base_url!r}")
    payload = json.dumps(body).encode()
    host = url.hostname if url.port is None else f"{url.hostname}:{url.port}"
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    request = (f"POST {url.path.rstrip('/')}{path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
               f"accept: text/event-stream\r\ncontent-length: {len(payload)}\r\n{extra}connection: close\r\n\r\n"
               ).encode() + payload
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[StreamedEvents] = loop.create_future()
    transport, _ = await loop.create_connection(lambda: EventStreamReader(request, finished, on_event),
                                                url.hostname, url.port or 80)
    try:
        return await finished
    finally:
        transport.close()
