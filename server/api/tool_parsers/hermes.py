"""Hermes-style tool calls (NousResearch Hermes 2 Pro, Qwen 2.5 and others), as vLLM's ``hermes`` parser reads them:
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them, after optional content."""

import json

from server.api import json_text
from server.api.tool_parsers.base import ParsedText, ParsedToolCall, ToolCallStream, ToolParser

OPEN, CLOSE = "<tool_call>", "</tool_call>"

SYSTEM_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML "
    "tags. You may call one or more functions to assist with the user query. Don't make assumptions about what "
    "values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with the function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class HermesToolParser(ToolParser):
    def stream(self) -> ToolCallStream:
        return HermesStream()

    def tools_prompt(self, tools: list[dict]) -> str:
        return SYSTEM_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))

    def format_call(self, name: str, arguments: str) -> str:
        try:
            arguments_value = json_text.loads(arguments)
        except json.JSONDecodeError:
            arguments_value = arguments
        call = json.dumps({"name": name, "arguments": arguments_value}, ensure_ascii=False)
        return f"{OPEN}\n{call}\n{CLOSE}"

    def format_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"

    def calls_grammar(self, tools: list[dict], parallel: bool, json_options: dict) -> str:
        shapes = [
            {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
             "properties": {"name": {"const": tool["function"]["name"]},
                            "arguments": tool["function"].get("parameters") or {"type": "object"}}}
            for tool in tools
        ]
        call = {"anyOf": shapes, "x-guidance": json_options}
        more = ' ("\\n" call)*' if parallel else ""
        return f'calls: call{more}\ncall: "{OPEN}\\n" %json {json.dumps(call)} "\\n{CLOSE}"\n'


class HermesStream(ToolCallStream):
    """Outside a call, content flows out except a tail that could still begin ``<tool_call>``; inside one, text is
    kept until ``</tool_call>`` and then read as a call. Once a call has been made, blank text between calls is
    dropped."""

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False
        self._made_a_call = False

    def feed(self, text: str) -> ParsedText:
        self._buffer += text
        parsed = ParsedText()
        while True:
            tag = CLOSE if self._inside else OPEN
            index = self._buffer.find(tag)
            if index < 0:
                break
            before, self._buffer = self._buffer[:index], self._buffer[index + len(tag) :]
            parsed += self._call(before) if self._inside else self._content(before)
            self._inside = not self._inside
        if not self._inside:
            keep = _partial_tag_length(self._buffer, OPEN)
            parsed += self._content(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
        return parsed

    def finish(self) -> ParsedText:
        rest, self._buffer = self._buffer, ""
        if self._inside:  # the model ended without closing its call: read it if it is complete
            self._inside = False
            return self._call(rest)
        return self._content(rest)

    def _content(self, text: str) -> ParsedText:
        return ParsedText(content="" if self._made_a_call and not text.strip() else text)

    def _call(self, body: str) -> ParsedText:
        call = _read_call(body)
        if call is None:  # not a call after all: the text stands as it was written
            return self._content(f"{OPEN}{body}{CLOSE}")
        self._made_a_call = True
        return ParsedText(tool_calls=[call])


def _read_call(body: str) -> ParsedToolCall | None:
    try:
        value = json_text.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(value["name"], text)


def _partial_tag_length(text: str, tag: str) -> int:
    """How long a tail of ``text`` is also a beginning of ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
