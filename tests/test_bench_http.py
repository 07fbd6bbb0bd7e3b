"""``bench http``'s lean streaming client against the real server on 127.0.0.1 (the same events httpx reads), its
framing on bytes cut at every boundary, and the CPU figures the bench prints."""

import asyncio
import json

import httpx
import pytest

from server.bench.cpu_time import main_thread_cpu_s, process_cpu_s
from server.bench.serve_http import stream_completion, time_clients
from server.bench.stream_client import EventStreamReader, StreamError, post_stream
from tests.api_server import shared_server

PROMPT = [1000 + i for i in range(24)]
BODY = {"model": "smollm", "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


def httpx_events(base_url: str, body: dict) -> list[bytes]:
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        return [line.encode() for line in response.iter_lines() if line and line != "data: [DONE]"]


def texts(events: list[bytes]) -> list[str]:
    return [choice["text"] for e in events for choice in json.loads(e.removeprefix(b"data: "))["choices"]]


@pytest.mark.server
def test_it_reads_the_same_events_as_httpx_and_the_usage_last(server):
    streamed = asyncio.run(post_stream(server.base_url, "/v1/completions", BODY))
    assert streamed.status == 200 and streamed.done
    reference = httpx_events(server.base_url, BODY)
    assert texts(streamed.events) == texts(reference)
    assert len(texts(streamed.events)) == 6
    assert streamed.last_json()["usage"]["completion_tokens"] == 6
    assert asyncio.run(stream_completion(server.base_url, PROMPT, 5)) == 5
    assert server.wait_all_blocks_free()


@pytest.mark.server
def test_an_error_status_raises_with_the_servers_message(server):
    with pytest.raises(StreamError, match="HTTP 400.*max_tokens"):
        asyncio.run(post_stream(server.base_url, "/v1/completions", {**BODY, "max_tokens": -1}))
    with pytest.raises(StreamError, match="HTTP 404"):
        asyncio.run(post_stream(server.base_url, "/v1/no-such-path", BODY))


@pytest.mark.server
def test_the_bench_round_counts_tokens_and_the_servers_cpu(server):
    pid = server.process.pid
    loop_before, whole_before = main_thread_cpu_s(pid), process_cpu_s(pid)
    served = asyncio.run(time_clients(server.base_url, [PROMPT, PROMPT[:10], PROMPT[:5]], 7))
    assert served.output_tokens == 21 and served.seconds > 0
    assert main_thread_cpu_s(pid) >= loop_before
    assert process_cpu_s(pid) > whole_before  # the engine ran


def test_a_refused_connection_is_an_os_error():
    with pytest.raises(OSError):
        asyncio.run(post_stream("http://127.0.0.1:9", "/v1/completions", BODY))
    with pytest.raises(ValueError, match="http://"):
        asyncio.run(post_stream("https://127.0.0.1:9", "/v1/completions", BODY))


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def feed(response: bytes, piece: int) -> asyncio.Future:
    """``response`` into a reader, ``piece`` bytes at a time, as TCP may cut it."""
    loop = asyncio.new_event_loop()
    finished = loop.create_future()
    reader = EventStreamReader(b"GET / HTTP/1.1\r\n\r\n", finished)
    transport = _Transport()
    reader.connection_made(transport)
    assert transport.written == b"GET / HTTP/1.1\r\n\r\n"
    for start in range(0, len(response), piece):
        reader.data_received(response[start: start + piece])
    reader.eof_received()
    if finished.done():
        assert transport.closed  # the reader ends the connection once the response is whole or bad
    else:
        reader.connection_lost(None)  # what the transport does after an EOF the reader did not expect
    loop.close()
    return finished


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


EVENTS = [b'data: {"choices":[{"text":"a\\n\\nb"}]}', b'data: {"usage":{"completion_tokens":2}}']
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, 10_000])
def test_chunked_events_survive_any_cut(piece):
    # One event split over two HTTP chunks, and two events in one.
    body = b"".join(e + b"\n\n" for e in EVENTS) + b"data: [DONE]\n\n"
    response = HEAD + chunked(body[:10], body[10:50], body[50:])
    result = feed(response, piece).result()
    assert result.events == EVENTS and result.done
    assert result.last_json() == {"usage": {"completion_tokens": 2}}


def test_a_stream_cut_short_or_failed_or_garbled_is_an_error():
    whole = HEAD + chunked(EVENTS[0] + b"\n\n")
    with pytest.raises(StreamError, match="closed mid-response"):
        feed(whole[:-5], 4).result()
    failed = HEAD + chunked(b'data: {"error":{"message":"engine failed"}}\n\n')
    with pytest.raises(StreamError, match="engine failed"):
        feed(failed, 5).result()
    with pytest.raises(StreamError, match="chunk size"):
        feed(HEAD + b"zz\r\n", 100).result()
    with pytest.raises(StreamError, match="status line"):
        feed(b"SMTP ready\r\n\r\n", 100).result()


def test_a_sized_error_body_is_read_whole():
    body = b'{"error":{"message":"no such model"}}'
    response = b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    with pytest.raises(StreamError, match="HTTP 404: .*no such model"):
        feed(response, 3).result()
