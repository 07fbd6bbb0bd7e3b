"""POST /v1/chat/completions: messages through the model's chat template, then generation."""

import time
from collections.abc import AsyncIterator

import jinja2
from fastapi import APIRouter, Request

from server.api.auth import RateLimitedCaller
from server.api.errors import invalid_request
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
from server.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaMessage,
)
from server.api.responses import ERROR_RESPONSES, STREAM_RESPONSE
from server.api.sse import event
from server.api.state import State
from server.engine.request import CompletionOutput
from server.models.tokenizer import Tokenizer

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**ERROR_RESPONSES, **STREAM_RESPONSE}
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State, caller: RateLimitedCaller
):
    check_model(state, body.model)
    reject_unsupported(body.unsupported_field())
    engine = state.engine
    prompt = await in_tokenizer_pool(state, _render, engine.tokenizer, [m.as_template_input() for m in body.messages])
    generation = await in_tokenizer_pool(
        state, fan_out, engine, new_id("chatcmpl"), [prompt], body.sampling_params(body.output_limit),
        body.num_choices, lambda text: engine.tokenizer.encode(text, add_special_tokens=False),
        cache_salt_for(state, caller, body.cache_salt),
    )
    run = await admit(state, caller, generation, "chat", request.headers)
    model = state.config.served_model_name

    def build(finals: list[CompletionOutput]) -> ChatCompletionResponse:
        choices = [
            ChatChoice(index=i, message=AssistantMessage(content=o.text), finish_reason=o.finish_reason,
                       stop_reason=o.stop_reason)
            for i, o in enumerate(finals)
        ]
        return ChatCompletionResponse(id=generation.id, model=model, choices=choices, usage=run.usage())

    return await respond(run, request, body.stream, lambda: _events(run, model, body.include_usage), build)


def _render(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except (jinja2.TemplateError, ValueError, TypeError) as error:
        raise invalid_request(f"the chat template cannot render these messages: {error}", param="messages") from None


async def _events(run: GenerationRun, model: str, include_usage: bool) -> AsyncIterator[bytes]:
    generation_id, created = run.generation.id, int(time.time())

    def chunk(choices: list[ChatChunkChoice], **extra: object) -> bytes:
        return event(ChatCompletionChunk(id=generation_id, created=created, model=model, choices=choices, **extra))

    for index in range(len(run.generation.requests)):
        yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
    async for index, output in run.outputs():
        if output.delta_text or output.finish_reason is not None:
            delta = DeltaMessage(content=output.delta_text) if output.delta_text else DeltaMessage()
            yield chunk([ChatChunkChoice(index=index, delta=delta, finish_reason=output.finish_reason,
                                         stop_reason=output.stop_reason)])
    if include_usage:
        yield chunk([], usage=run.usage())
