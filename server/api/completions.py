"""POST /v1/completions: a prompt (text, texts, token ids, or lists of token ids) in, completions out."""

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from server.api.auth import RateLimitedCaller
from server.api.generation import (
    GenerationRun,
    admit,
    cache_salt_for,
    check_model,
    fan_out,
    in_tokenizer_pool,
    new_id,
    reject_unsupported,
    respond,
)
from server.api.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from server.api.responses import ERROR_RESPONSES, STREAM_RESPONSE
from server.api.sse import event
from server.api.state import State
from server.engine.request import CompletionOutput

router = APIRouter(tags=["completions"])


@router.post("/v1/completions", response_model=CompletionResponse, responses={**ERROR_RESPONSES, **STREAM_RESPONSE})
async def create_completion(body: CompletionRequest, request: Request, state: State, caller: RateLimitedCaller):
    check_model(state, body.model)
    reject_unsupported(body.unsupported_field())
    params = body.sampling_params(body.max_tokens)
    engine = state.engine
    generation = await in_tokenizer_pool(
        state, fan_out, engine, new_id("cmpl"), body.prompts(), params, body.num_choices, engine.tokenizer.encode,
        cache_salt_for(state, caller, body.cache_salt),
    )
    run = await admit(state, caller, generation, "text_completion", request.headers)
    model = state.config.served_model_name

    def build(finals: list[CompletionOutput]) -> CompletionResponse:
        choices = [
            CompletionChoice(index=i, text=o.text, finish_reason=o.finish_reason, stop_reason=o.stop_reason)
            for i, o in enumerate(finals)
        ]
        return CompletionResponse(id=generation.id, model=model, choices=choices, usage=run.usage())

    return await respond(run, request, body.stream, lambda: _events(run, model, body.include_usage), build)


async def _events(run: GenerationRun, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    generation_id, created = run.generation.id, int(time.time())
    async for index, output in run.outputs():
        if output.delta_text or output.finish_reason is not None:
            choice = CompletionChoice(
                index=index, text=output.delta_text, finish_reason=output.finish_reason,
                stop_reason=output.stop_reason,
            )
            yield event(CompletionResponse(id=generation_id, created=created, model=model, choices=[choice]))
    if include_usage:
        yield event(CompletionResponse(id=generation_id, created=created, model=model, choices=[], usage=run.usage()))
