"""Tool calls in chat: what ``tool_choice`` asks for, the grammar that forces a call (``required`` or a named
function, as vLLM forces them), and the calls read back out of each choice, whole or as deltas."""

import json
import uuid
from dataclasses import dataclass
from typing import Literal

from server.api import json_text
from server.api.errors import invalid_request
from server.api.grammar_spec import GrammarSpec, json_schema_spec
from server.api.llguidance_grammar import JSON_OPTIONS
from server.api.protocol import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    NamedFunction,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolCallFunction,
)
from server.api.tool_parsers import ParsedText, ParsedToolCall, ToolCallStream, ToolParser

ToolMode = Literal["none", "auto", "required", "named"]
ANY_ARGUMENTS = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    """``offered``: the tools the prompt shows the model (none when ``tool_choice`` is ``none``)."""

    mode: ToolMode
    offered: list[Tool]
    named: Tool | None = None
    parallel: bool = True

    def grammar(self) -> GrammarSpec | None:
        if self.mode == "named":
            return json_schema_spec(self.named.function.parameters or ANY_ARGUMENTS, "tools")
        if self.mode == "required":
            return json_schema_spec(_required_schema(self.offered, self.parallel), "tools")
        return None


def answer_or_calls(answer: GrammarSpec, plan: ToolPlan, parser: ToolParser) -> GrammarSpec:
    """Under ``auto``, a format constrains the final answer only, as OpenAI's does: the output is either the
    answer, or tool calls in the parser's format. Only a JSON answer can be told apart from a call."""
    if answer.kind != "json_schema":
        raise invalid_request(f"{answer.param} with tools under tool_choice auto must be a JSON schema, so that "
                              "a final answer can be told apart from a tool call", param=answer.param,
                              code="unsupported")
    schema = json.loads(answer.source) | {"x-guidance": JSON_OPTIONS}
    tools = [tool.model_dump(exclude_none=True) for tool in plan.offered]
    lark = f"start: answer | calls\nanswer: %json {json.dumps(schema)}\n"
    return GrammarSpec("grammar", lark + parser.calls_grammar(tools, plan.parallel, JSON_OPTIONS), answer.param)


def tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    """Raises APIError 400 for a tool_choice that the tools cannot satisfy."""
    tools, choice = body.tools or [], body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if body.functions is not None or body.function_call is not None:
        tools, choice, parallel = _legacy_tools(body), _legacy_choice(body.function_call), False
    if choice is None:
        choice = "auto" if tools else "none"
    if choice != "none" and not tools:
        raise invalid_request("tool_choice needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        named = next((tool for tool in tools if tool.function.name == choice.function.name), None)
        if named is None:
            raise invalid_request(f"tool_choice names {choice.function.name!r}, which is not among the tools",
                                  param="tool_choice")
        return ToolPlan("named", tools, named, parallel)
    return ToolPlan(choice, [] if choice == "none" else tools, None, parallel)


def _legacy_tools(body: ChatCompletionRequest) -> list[Tool]:
    """OpenAI's deprecated ``functions``, served as tools; its answer holds one call."""
    if body.functions is None:
        raise invalid_request("function_call needs functions", param="function_call")
    if body.tools is not None or body.tool_choice is not None:
        raise invalid_request("send tools or the legacy functions, not both", param="functions")
    return [Tool(type="function", function=function) for function in body.functions]


def _legacy_choice(function_call: str | NamedFunction | None) -> str | NamedToolChoice | None:
    if isinstance(function_call, NamedFunction):
        return NamedToolChoice(type="function", function=function_call)
    return function_call


def _required_schema(tools: list[Tool], parallel: bool) -> dict:
    """vLLM's: a list of ``{"name", "parameters"}`` objects, one shape per tool."""
    calls = [
        {"type": "object", "properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                          "parameters": tool.function.parameters or ANY_ARGUMENTS},
         "required": ["name", "parameters"], "additionalProperties": False}
        for tool in tools
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return schema | ({} if parallel else {"maxItems": 1})


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def as_tool_calls(calls: list[ParsedToolCall]) -> list[ToolCall]:
    return [ToolCall(id=new_call_id(), function=ToolCallFunction(name=c.name, arguments=c.arguments)) for c in calls]


def _required_calls(text: str) -> ParsedText:
    """The grammar's list of calls; text cut short by max_tokens stays content."""
    try:
        items = json_text.loads(text)
        calls = [ParsedToolCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False)) for item in items]
    except (json.JSONDecodeError, KeyError, TypeError):
        return ParsedText(content=text)
    return ParsedText(tool_calls=calls)


def read_message(plan: ToolPlan, parser: ToolParser, text: str) -> ParsedText:
    """A finished choice's content and tool calls."""
    if plan.mode == "named":
        return ParsedText(tool_calls=[ParsedToolCall(plan.named.function.name, text)])
    if plan.mode == "required":
        return _required_calls(text)
    if plan.mode == "auto":
        return parser.extract(text)
    return ParsedText(content=text)


def finish_reason(reason: str | None, made_calls: bool, legacy: bool = False) -> str | None:
    if made_calls and reason == "stop":
        return "function_call" if legacy else "tool_calls"
    return reason


class ToolCallDeltas:
    """One streamed choice's text as content deltas and OpenAI ``tool_calls`` deltas. A named call streams its
    arguments as they come; ``required`` calls come whole once their list is complete; ``auto`` calls come
    whole as the parser completes each."""

    def __init__(self, plan: ToolPlan, parser: ToolParser) -> None:
        self._plan = plan
        self._stream: ToolCallStream | None = parser.stream() if plan.mode == "auto" else None
        self._text = ""
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[DeltaToolCall]]:
        if self._plan.mode == "named":
            return "", self._named_delta(text) if text or not self.num_calls else []
        if self._plan.mode == "required":
            self._text += text
            return "", []
        if self._stream is not None:
            return self._deltas(self._stream.feed(text))
        return text, []

    def finish(self) -> tuple[str, list[DeltaToolCall]]:
        if self._plan.mode == "required":
            return self._deltas(_required_calls(self._text))
        if self._stream is not None:
            return self._deltas(self._stream.finish())
        return "", []

    def _named_delta(self, text: str) -> list[DeltaToolCall]:
        if self.num_calls:
            return [DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))]
        self.num_calls = 1
        name = self._plan.named.function.name
        return [DeltaToolCall(index=0, id=new_call_id(), type="function",
                              function=DeltaFunctionCall(name=name, arguments=text))]

    def _deltas(self, parsed: ParsedText) -> tuple[str, list[DeltaToolCall]]:
        deltas = []
        for call in parsed.tool_calls:
            deltas.append(DeltaToolCall(index=self.num_calls, id=new_call_id(), type="function",
                                        function=DeltaFunctionCall(name=call.name, arguments=call.arguments)))
            self.num_calls += 1
        return parsed.content, deltas
