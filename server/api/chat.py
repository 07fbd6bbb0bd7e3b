"""POST /v1/chat/completions: messages (and tools) through the model's chat template, then generation; the
answer's content, tool calls and logprobs in OpenAI's shapes."""

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from server.api.auth import RateLimitedCaller
from server.api.chat_prompt import render_chat
from server.api.errors import invalid_request
from server.api.generation import (
    GenerationRun,
    admit,
    cache_salt_for,
    fan_out,
    in_tokenizer_pool,
    new_id,
    respond,
    route,
)
from server.api.grammar_spec import GrammarSpec, requested_grammar
from server.api.logprobs import chat_logprobs
from server.api.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from server.api.responses import ERROR_RESPONSES, STREAM_RESPONSE
from server.api.sse import event
from server.api.state import State
from server.api.structured_output import compile_grammar
from server.api.tool_calls import (
    ToolCallDeltas,
    ToolPlan,
    answer_or_calls,
    as_tool_calls,
    finish_reason,
    read_message,
    tool_plan,
)
from server.api.tool_parsers import ToolParser
from server.engine.request import CompletionOutput, InvalidRequestError
from server.models.tokenizer import Tokenizer

router = APIRouter(tags=["chat"])


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**ERROR_RESPONSES, **STREAM_RESPONSE}
)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, state: State, caller: RateLimitedCaller
):
    to = route(state, body.model, [message.text for message in body.messages], body.output_limit)
    if body.top_logprobs and not body.logprobs:
        raise invalid_request("top_logprobs needs logprobs: true", param="top_logprobs")
    plan = tool_plan(body)
    engine, parser = to.engine, state.tool_parser
    grammar = await compile_grammar(state.grammars[to.model], _one_grammar(requested_grammar(body), plan, parser),
                                   caller.tenant)
    prompt = await in_tokenizer_pool(state, render_chat, engine.tokenizer, body.messages, plan.offered, parser)
    try:
        generation = await in_tokenizer_pool(
            state, fan_out, engine, new_id("chatcmpl"), [prompt], body.sampling_params(body.output_limit),
            body.num_choices, lambda text: engine.tokenizer.encode(text, add_special_tokens=False),
            cache_salt_for(state, caller, body.cache_salt), grammar.new_constraint if grammar else None,
        )
    except InvalidRequestError as error:
        # The rendered prompt is the request's messages.
        error.param = "messages" if error.param == "prompt" else error.param
        raise
    run = await admit(state, caller, generation, "chat", request.headers, to, body.stream)
    model, legacy = to.model, body.legacy_functions

    def build(finals: list[CompletionOutput]) -> ChatCompletionResponse:
        return ChatCompletionResponse(id=generation.id, model=model, usage=run.usage(), choices=[
            _choice(i, o, plan, parser, engine.tokenizer, legacy) for i, o in enumerate(finals)
        ])

    def events() -> AsyncIterator[bytes]:
        return _events(run, model, body.include_usage, plan, parser, engine.tokenizer, legacy)

    return await respond(run, request, body.stream, events, build)


def _one_grammar(requested: GrammarSpec | None, plan: ToolPlan, parser: ToolParser) -> GrammarSpec | None:
    forced = plan.grammar()
    if requested is not None and forced is not None:
        raise invalid_request(f"{requested.param} cannot be combined with tool_choice {plan.mode}",
                              param=requested.param)
    if requested is not None and plan.mode == "auto":
        return answer_or_calls(requested, plan, parser)
    return requested or forced


def _choice(index: int, output: CompletionOutput, plan: ToolPlan, parser: ToolParser,
            tokenizer: Tokenizer, legacy: bool) -> ChatChoice:
    parsed = read_message(plan, parser, output.text)
    calls = as_tool_calls(parsed.tool_calls)
    content = parsed.content if parsed.content.strip() or not calls else None
    message = AssistantMessage(content=content, tool_calls=calls)
    if legacy and calls:
        message = AssistantMessage(content=content, function_call=calls[0].function)
    return ChatChoice(
        index=index,
        message=message,
        logprobs=chat_logprobs(tokenizer, output.logprobs) if output.logprobs is not None else None,
        finish_reason=finish_reason(output.finish_reason, bool(calls), legacy),
        stop_reason=output.stop_reason,
    )


async def _events(run: GenerationRun, model: str, include_usage: bool, plan: ToolPlan, parser: ToolParser,
                  tokenizer: Tokenizer, legacy: bool) -> AsyncIterator[bytes]:
    generation_id, created = run.generation.id, int(time.time())

    def chunk(choices: list[ChatChunkChoice], **extra: object) -> bytes:
        return event(ChatCompletionChunk(id=generation_id, created=created, model=model, choices=choices, **extra))

    calls = [ToolCallDeltas(plan, parser) for _ in run.generation.requests]
    for index in range(len(run.generation.requests)):
        yield chunk([ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
    async for index, output in run.outputs():
        content, tool_calls = calls[index].feed(output.delta_text)
        reason = output.finish_reason
        if reason is not None:
            rest, more_calls = calls[index].finish()
            content, tool_calls = content + rest, tool_calls + more_calls
            reason = finish_reason(reason, calls[index].num_calls > 0, legacy)
        logprobs = chat_logprobs(tokenizer, output.delta_logprobs) if output.delta_logprobs else None
        if content or tool_calls or logprobs is not None or reason is not None:
            delta = DeltaMessage(content=content or None, tool_calls=tool_calls or None)
            if legacy:
                delta = DeltaMessage(content=content or None, function_call=_first_call(tool_calls))
            yield chunk([ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=reason,
                                         stop_reason=output.stop_reason)])
    if include_usage:
        yield chunk([], usage=run.usage())


def _first_call(deltas: list[DeltaToolCall]) -> DeltaFunctionCall | None:
    """A legacy ``function_call`` delta: the first call's, as a legacy answer holds one call."""
    return next((delta.function for delta in deltas if delta.index == 0), None)
