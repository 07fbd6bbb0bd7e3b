"""One streamed request to an OpenAI-compatible server, timed chunk by chunk into a record."""

import json
import time
from dataclasses import dataclass, field

import httpx

from server.bench.serve.dataset import BenchRequest

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
SNIPPET_CHARS = 80


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
    sent = time.perf_counter()
    record = RequestRecord(index, start_s=sent - run_started, prompt_tokens=request.prompt_len)
    try:
        async with client.stream("POST", PATHS[target.endpoint], json=request_body(target, request),
                                 headers=auth_headers(target.api_key)) as response:
            if response.status_code != 200:
                record.error = http_error(response.status_code, await response.aread())
            else:
                await read_stream(response, record, sent)
    except httpx.HTTPError as error:
        record.error = describe_exception(error)
    record.latency_s = time.perf_counter() - sent
    record.ok = record.error is None
    return record


async def read_stream(response: httpx.Response, record: RequestRecord, sent: float) -> None:
    """Fills ``record`` from the server-sent events, setting ``record.error`` if the stream breaks."""
    last = sent
    chunks = 0
    usage = None
    async for line in response.aiter_lines():
        payload = line.removeprefix("data:").strip()
        if not line.startswith("data:") or payload == "[DONE]":
            continue
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            record.error = f"stream chunk not JSON: {payload[:SNIPPET_CHARS]}"
            return
        if "error" in event:
            record.error = "stream " + error_text(event["error"])
            return
        now = time.perf_counter()
        if chunk_text(event):
            if record.ttft_s is None:
                record.ttft_s = now - sent
            else:
                record.itl_s.append(now - last)
            last = now
            chunks += 1
        usage = event.get("usage") or usage
    record.output_tokens = usage.get("completion_tokens", chunks) if usage else chunks
    if usage and usage.get("prompt_tokens") is not None:
        record.prompt_tokens = usage["prompt_tokens"]


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
