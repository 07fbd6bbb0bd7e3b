"""POST /v1/completions: a prompt (text, texts, token ids, or lists of token ids) in, completions out; with
``echo``, each choice's text starts with its prompt (and, with ``logprobs``, so do its logprobs)."""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter, Request

from server.api.auth import RateLimitedCaller
from server.api.generation import (
    GenerationRun,
    admit,
    cache_salt_for,
    fan_out,
    in_tokenizer_pool,
    new_id,
    reject_unsupported,
    respond,
    route,
)
from server.api.grammar_spec import requested_grammar
from server.api.logprobs import CompletionLogprobsWriter
from server.api.protocol import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse
from server.api.responses import ERROR_RESPONSES, STREAM_RESPONSE
from server.api.sse import event
from server.api.state import State
from server.api.structured_output import compile_grammar
from server.engine.request import CompletionOutput, TokenLogprob
from server.models.tokenizer import Tokenizer

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=CompletionResponse, responses={**ERROR_RESPONSES, **STREAM_RESPONSE})
async def create_completion(body: CompletionRequest, request: Request, state: State, caller: RateLimitedCaller):
    to = route(state, body.model, body.prompts(), body.output_limit)
    reject_unsupported(body.unsupported_field())
    params = body.sampling_params(body.output_limit)
    engine = to.engine
    grammar = await compile_grammar(state.grammars[to.model], requested_grammar(body), caller.tenant)
    generation = await in_tokenizer_pool(
        state, fan_out, engine, new_id("cmpl"), body.prompts(), params, body.num_choices, engine.tokenizer.encode,
        cache_salt_for(state, caller, body.cache_salt), grammar.new_constraint if grammar else None,
    )
    run = await admit(state, caller, generation, "text_completion", request.headers, to, body.stream)
    model = to.model
    shape = ChoiceShape(run, engine.tokenizer, body.echo, body.logprobs is not None)

    def build(finals: list[CompletionOutput]) -> CompletionResponse:
        choices = []
        for i, o in enumerate(finals):
            text, logprobs = shape.first_chunk(i, o.text, o.token_ids, o.logprobs)
            choices.append(CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=o.finish_reason,
                                            stop_reason=o.stop_reason))
        return CompletionResponse(id=generation.id, model=model, choices=choices, usage=run.usage())

    return await respond(run, request, body.stream, lambda: _events(run, model, body.include_usage, shape), build)


@dataclass
class ChoiceShape:
    """Writes each choice's text and logprobs, chunk after chunk: the first chunk carries the echoed prompt."""

    run: GenerationRun
    tokenizer: Tokenizer
    echo: bool
    with_logprobs: bool

    def __post_init__(self) -> None:
        self._started: set[int] = set()
        self._writers: dict[int, CompletionLogprobsWriter] = {}

    def first_chunk(self, index: int, text: str, token_ids: list[int],
                    entries: list[TokenLogprob] | None) -> tuple[str, CompletionLogprobs | None]:
        self._started.add(index)
        prompt_ids = self.run.generation.requests[index].prompt_token_ids if self.echo else []
        if self.echo:
            text = self.tokenizer.decode(prompt_ids) + text
        if not self.with_logprobs:
            return text, None
        prompt_entries = self.run.prompt_logprobs[index] or [None] * len(prompt_ids)
        self._writers[index] = writer = CompletionLogprobsWriter(self.tokenizer)
        return text, writer.write([*prompt_ids, *token_ids], [*prompt_entries[: len(prompt_ids)], *(entries or [])])

    def next_chunk(self, index: int, output: CompletionOutput) -> tuple[str, CompletionLogprobs | None]:
        if index not in self._started:
            return self.first_chunk(index, output.delta_text, output.delta_token_ids, output.delta_logprobs)
        if not self.with_logprobs:
            return output.delta_text, None
        return output.delta_text, self._writers[index].write(output.delta_token_ids, output.delta_logprobs or [])


async def _events(run: GenerationRun, model: str, include_usage: bool, shape: ChoiceShape) -> AsyncIterator[bytes]:
    generation_id, created = run.generation.id, int(time.time())
    async for index, output in run.outputs():
        text, logprobs = shape.next_chunk(index, output)
        if text or (logprobs is not None and logprobs.tokens) or output.finish_reason is not None:
            choice = CompletionChoice(
                index=index, text=text, logprobs=logprobs, finish_reason=output.finish_reason,
                stop_reason=output.stop_reason,
            )
            yield event(CompletionResponse(id=generation_id, created=created, model=model, choices=[choice]))
    if include_usage:
        yield event(CompletionResponse(id=generation_id, created=created, model=model, choices=[], usage=run.usage()))
