"""What completions and chat share: fan a request out into engine requests, admit it, then collect or
stream its choices, aborting everything left if the client goes away."""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.types import Receive

from server.api.auth.caller import Caller
from server.api.errors import APIError, draining, engine_failed, invalid_request, unavailable
from server.api.protocol import MAX_CHOICES, Usage
from server.api.rate_limits import TokenReservation
from server.api.router import Route
from server.api.routing_policy import RoutingRequest
from server.api.sse import DONE, EventStreamResponse, error_event
from server.api.state import ServerState
from server.engine.async_engine import AsyncEngine, EngineDeadError, EngineStoppedError, OutputStream
from server.engine.constraint import TokenConstraint
from server.engine.request import CompletionOutput, QueueFullError, Request, SamplingParams, TokenLogprob
from server.http_status import CLIENT_CLOSED_REQUEST
from telemetry.service import Telemetry

logger = logging.getLogger("vigil.api")

QUEUE_FULL_RETRY_AFTER_S = 1.0
ROUTING_CHARS_PER_TOKEN = 4
T = TypeVar("T")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_model(state: ServerState, model: str | None) -> AsyncEngine:
    """The engine of the served model named (the default when none is); 404 for a name not served."""
    return state.router.engine_of(model)


def route(state: ServerState, model: str | None, texts: Sequence[str | list[int]], max_tokens: int | None) -> Route:
    """The model a generation goes to: the one named, or an alias's choice for these prompt texts (a prompt of
    token ids counts ROUTING_CHARS_PER_TOKEN characters a token)."""
    chars = sum(len(t) if isinstance(t, str) else ROUTING_CHARS_PER_TOKEN * len(t) for t in texts)
    text = "\n".join(t for t in texts if isinstance(t, str))
    return state.router.route(model, RoutingRequest(text, chars, max_tokens))


def reject_unsupported(field: str | None) -> None:
    if field is not None:
        raise invalid_request(f"{field} is not supported by this server", param=field, code="unsupported")


@dataclass(frozen=True)
class Generation:
    """One HTTP request as engine requests: each prompt times ``n`` choices; choice ``p * n + j``."""

    id: str
    requests: list[Request]
    num_prompt_tokens: int  # each prompt counted once, however many choices it has
    choice_of: dict[str, int]

    @property
    def token_budget(self) -> int:
        """The most tokens this request can cost: what the tokens-per-minute limit reserves."""
        return self.num_prompt_tokens + sum(r.max_tokens for r in self.requests)


def cache_salt_for(state: ServerState, caller: Caller, requested: str | None) -> str:
    """The prefix-cache salt of a caller's request: its tenant's (whenever authentication is on, unless sharing
    across tenants is allowed), then the request's own ``cache_salt``."""
    isolated = state.authenticated and not state.config.share_prefix_cache_across_tenants
    return f"{caller.tenant if isolated else ''}\0{requested or ''}"


async def in_tokenizer_pool(state: ServerState, function: Callable[..., T], *args: object) -> T:
    """Run blocking text work (templates, tokenizing) in the server's bounded pool, off the event loop."""
    return await asyncio.get_running_loop().run_in_executor(state.tokenizer_pool, function, *args)


def fan_out(
    engine: AsyncEngine,
    generation_id: str,
    prompts: Sequence[str | list[int]],
    params: SamplingParams,
    n: int,
    encode: Callable[[str], list[int]],
    cache_salt: str = "",
    constrain: Callable[[], TokenConstraint] | None = None,
) -> Generation:
    """Tokenize and validate (raises InvalidRequestError). Blocking: run it off the event loop. ``constrain``
    makes each choice's own structured-output constraint."""
    if not prompts:
        raise invalid_request("the prompt is empty", param="prompt")
    if len(prompts) * n > MAX_CHOICES:
        raise invalid_request(f"prompts times n must be at most {MAX_CHOICES}", param="n")
    requests: list[Request] = []
    num_prompt_tokens = 0
    for prompt_index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            engine.check_prompt_length(prompt)
        token_ids = encode(prompt) if isinstance(prompt, str) else prompt
        for choice in range(n):
            seeded = params if params.seed is None else replace(params, seed=params.seed + choice)
            request_id = f"{generation_id}-{prompt_index * n + choice}"
            constraint = constrain() if constrain is not None else None
            requests.append(engine.make_request(request_id, token_ids, seeded, cache_salt=cache_salt,
                                                constraint=constraint))
        num_prompt_tokens += len(token_ids)
    choice_of = {request.request_id: index for index, request in enumerate(requests)}
    return Generation(generation_id, requests, num_prompt_tokens, choice_of)


class GenerationRun:
    """An admitted generation: its output stream, its token reservation, and the usage so far."""

    def __init__(
        self,
        generation: Generation,
        stream: OutputStream,
        reservation: TokenReservation,
        tenant: str,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.generation = generation
        self.tenant = tenant
        self._stream = stream
        self._reservation = reservation
        self._telemetry = telemetry
        self._completion_tokens = [0] * len(generation.requests)
        # Per choice, once its first output has come: its prompt's logprobs, where the request asked for them.
        self.prompt_logprobs: list[list[TokenLogprob | None] | None] = [None] * len(generation.requests)
        self._unfinished = len(generation.requests)
        self._failed = False
        self._closed = False

    async def outputs(self) -> AsyncIterator[tuple[int, CompletionOutput]]:
        """(choice index, output) as the engine produces them; engine failures become APIError."""
        try:
            async for output in self._stream:
                index = self.generation.choice_of[output.request_id]
                completion = output.outputs[0]
                self.prompt_logprobs[index] = output.prompt_logprobs
                self._completion_tokens[index] = len(completion.token_ids)
                self._unfinished -= completion.finish_reason is not None
                yield index, completion
        except EngineStoppedError:
            self._failed = True
            raise unavailable("the server shut down before this request finished", "draining") from None
        except EngineDeadError:
            self._failed = True
            raise engine_failed() from None

    async def finals(self) -> list[CompletionOutput]:
        finals: dict[int, CompletionOutput] = {}
        async for index, output in self.outputs():
            if output.finish_reason is not None:
                finals[index] = output
        return [finals[index] for index in sorted(finals)]

    async def finals_unless_disconnected(self, receive: Receive) -> list[CompletionOutput] | None:
        """Every choice's final output; None if the client disconnects first (the caller then closes)."""
        work = asyncio.ensure_future(self.finals())
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
        if not work.done() or work.cancelled():
            return None
        return work.result()

    async def collect(self, receive: Receive) -> list[CompletionOutput] | None:
        """The unstreamed answer: every choice's final output, or None if the client left; closes the run."""
        try:
            return await self.finals_unless_disconnected(receive)
        finally:
            self.close()

    async def event_stream(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``events``, then ``[DONE]``. An error after the 200 header can only travel as an event: it becomes one,
        and counts as a ``stream_error``."""
        try:
            async for item in events:
                yield item
        except APIError as error:
            if self._telemetry is not None:
                self._telemetry.record_error("stream_error")
            yield error_event(error)
        yield DONE

    def usage(self) -> Usage:
        completion = sum(self._completion_tokens)
        prompt = self.generation.num_prompt_tokens
        return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    def close(self) -> None:
        """Abort what is unfinished and refund the unused token reservation. Safe to call twice.

        Choices still unfinished here, with the engine healthy, mean the client went away.
        """
        if self._closed:
            return
        for index, request in enumerate(self.generation.requests):  # what an unstreamed choice left unfinished cost
            generated = self._stream.num_generated.get(request.request_id, 0)
            self._completion_tokens[index] = max(self._completion_tokens[index], generated)
        outcome = "failed" if self._failed else "client_disconnect" if self._unfinished else "finished"
        if outcome == "client_disconnect" and self._telemetry is not None:
            self._telemetry.record_error("client_disconnect")
        # One line per HTTP generation, with its tenant; the engine's request_finished lines carry the same id.
        logger.info("generation_finished", extra={
            "generation_id": self.generation.id, "tenant": self.tenant, "outcome": outcome,
            "prompt_tokens": self.generation.num_prompt_tokens, "completion_tokens": sum(self._completion_tokens),
        })
        self._closed = True
        self._stream.close()
        self._reservation.settle(self.generation.num_prompt_tokens + sum(self._completion_tokens))


async def admit(
    state: ServerState, caller: Caller, generation: Generation, operation: str, headers: Mapping[str, str],
    to: Route, stream: bool,
) -> GenerationRun:
    """Reserve tokens and hand the requests to the engine of the route ``to``. ``operation`` (``text_completion``
    or ``chat``) and the request headers (for ``traceparent``) name the request's trace span. An unstreamed
    answer (``stream`` false) takes each choice's final output alone."""
    reservation = state.limiter.reserve_tokens(caller.tenant, generation.token_budget)
    tracer = state.telemetry.tracer if state.telemetry is not None else None
    request_ids = [r.request_id for r in generation.requests]
    if tracer is not None:
        first = generation.requests[0]
        tracer.start(request_ids, operation, to.model, first.sampling_params, first.max_tokens, headers,
                     caller.tenant)
    try:
        outputs = await to.engine.add(generation.requests, final_only=not stream)
    except BaseException as error:
        if tracer is not None:
            tracer.discard(request_ids, type(error).__name__)
        reservation.settle(0)
        raise _admission_error(error) from None
    return GenerationRun(generation, outputs, reservation, caller.tenant, state.telemetry)


async def respond(
    run: GenerationRun,
    request: HTTPRequest,
    stream: bool,
    events: Callable[[], AsyncIterator[bytes]],
    build: Callable[[list[CompletionOutput]], BaseModel],
) -> Response | BaseModel:
    """The event stream, or the whole answer once every choice has finished (499 when the client left first)."""
    if stream:
        return EventStreamResponse(run.event_stream(events()), cleanup=run.close)
    finals = await run.collect(request.receive)
    if finals is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return build(finals)


def _admission_error(error: BaseException) -> BaseException:
    if isinstance(error, QueueFullError):
        return APIError(429, "the server's queue is full; retry later", code="queue_full",
                        retry_after=QUEUE_FULL_RETRY_AFTER_S)
    if isinstance(error, EngineStoppedError):
        return draining()
    if isinstance(error, EngineDeadError):
        return unavailable("the engine has failed; this server needs a restart", "engine_dead")
    return error


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
