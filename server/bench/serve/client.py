"""One streamed request to an OpenAI-compatible server, timed chunk by chunk into a record."""

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from server.bench.serve.dataset import BenchRequest
from server.bench.stream_client import ErrorStatus, StreamError, post_stream

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SNIPPET_CHARS = 80
REQUEST_TIMEOUT_S = 3600.0


class ServerUnreachable(Exception):
    pass


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    endpoint: str  # a key of PATHS
    api_key: str | None = None
    ignore_eos: bool = False
    extra_body: dict = field(default_factory=dict)  # merged into every request body


@dataclass
class RequestRecord:
    index: int
    start_s: float  # when it was sent, after the start of its run
    ok: bool = False
    latency_s: float = 0.0
    ttft_s: float | None = None  # to the first chunk that carries text
    itl_s: list[float] = field(default_factory=list)  # between the chunks that carry text
    prompt_tokens: int | None = None  # the server's usage, else our tokenizer's count
    output_tokens: int = 0  # the server's usage, else the chunks that carried text
    error: str | None = None


def normalize_base_url(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def first_model(base_url: str, api_key: str | None) -> str | None:
    """The first id of GET /v1/models, or None when the server does not list one; raises if it cannot be
    reached at all."""
    try:
        response = httpx.get(f"{base_url}/v1/models", headers=auth_headers(api_key), timeout=30)
    except httpx.TransportError as error:
        raise ServerUnreachable(f"cannot reach {base_url}: {describe_exception(error)}") from None
    try:
        return response.json()["data"][0]["id"] if response.status_code == 200 else None
    except (ValueError, LookupError, TypeError):
        return None


def request_body(target: Target, request: BenchRequest) -> dict:
    body: dict = {"model": target.model, "max_tokens": request.output_len, "temperature": 0.0, "stream": True,
                  "stream_options": {"include_usage": True}}
    if target.endpoint == "chat":
        body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    if target.ignore_eos:
        body["ignore_eos"] = True
    return body | target.extra_body


async def send(client: httpx.AsyncClient, target: Target, request: BenchRequest, index: int,
               run_started: float) -> RequestRecord:
    """One request, over the lean client (``server/bench/stream_client.py``) where the target is plain http, else
    over ``client`` (httpx). On the machine under test the client's CPU comes out of the server's: on two Zen 5
    cores httpx took 317 µs of CPU a streamed token, the lean client 128."""
    sent = time.perf_counter()
    record = RequestRecord(index, start_s=sent - run_started, prompt_tokens=request.prompt_len)
    timer = ChunkTimer(record, sent)
    body, headers = request_body(target, request), auth_headers(target.api_key)
    try:
        if target.base_url.startswith("http://"):
            await asyncio.wait_for(post_stream(target.base_url, PATHS[target.endpoint], body, headers, timer.take),
                                   REQUEST_TIMEOUT_S)
        else:
            await read_stream(client, PATHS[target.endpoint], body, headers, timer)
    except ErrorStatus as error:
        record.error = http_error(error.status, error.body)
    except StreamError as error:
        record.error = record.error or describe_exception(error)
    except (httpx.HTTPError, OSError) as error:
        record.error = describe_exception(error)
    timer.finish()
    record.latency_s = time.perf_counter() - sent
    record.ok = record.error is None
    return record


class ChunkTimer:
    """Fills a record from a stream's ``data:`` events as they arrive: the first chunk with text, the gaps between
    the later ones, and the server's usage."""

    def __init__(self, record: RequestRecord, sent: float) -> None:
        self._record = record
        self._last = sent
        self._sent = sent
        self._chunks = 0
        self._usage: dict | None = None

    def take(self, payload: bytes | str) -> None:
        """One event's payload (after ``data:``); raises StreamError, with the record's error set, for one that is
        not JSON or carries an error."""
        record = self._record
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            text = payload if isinstance(payload, str) else payload.decode(errors="replace")
            record.error = f"stream chunk not JSON: {text[:SNIPPET_CHARS]}"
            raise StreamError(record.error) from None
        if "error" in event:
            record.error = "stream " + error_text(event["error"])
            raise StreamError(record.error)
        now = time.perf_counter()
        if chunk_text(event):
            if record.ttft_s is None:
                record.ttft_s = now - self._sent
            else:
                record.itl_s.append(now - self._last)
            self._last = now
            self._chunks += 1
        self._usage = event.get("usage") or self._usage

    def finish(self) -> None:
        record, usage = self._record, self._usage
        record.output_tokens = usage.get("completion_tokens", self._chunks) if usage else self._chunks
        if usage and usage.get("prompt_tokens") is not None:
            record.prompt_tokens = usage["prompt_tokens"]


async def read_stream(client: httpx.AsyncClient, path: str, body: dict, headers: dict[str, str],
                      timer: ChunkTimer) -> None:
    async with client.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise ErrorStatus(response.status_code, await response.aread())
        async for line in response.aiter_lines():
            payload = line.removeprefix("data:").strip()
            if line.startswith("data:") and payload != "[DONE]":
                timer.take(payload)


def chunk_text(event: dict) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    if delta is not None:
        return delta.get("content") or delta.get("reasoning_content") or ""
    return choice.get("text") or ""


def http_error(status: int, body: bytes) -> str:
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        text = body.decode(errors="replace").strip()[:SNIPPET_CHARS]
        return f"HTTP {status}: {text}" if text else f"HTTP {status}"
    return f"HTTP {status} {error_text(error)}"


def error_text(error: dict | str) -> str:
    if isinstance(error, str):
        return error[:SNIPPET_CHARS]
    return f"{error.get('type') or error.get('code') or 'error'}: {str(error.get('message', ''))[:SNIPPET_CHARS]}"


def describe_exception(error: Exception) -> str:
    detail = str(error)[:SNIPPET_CHARS]
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__
