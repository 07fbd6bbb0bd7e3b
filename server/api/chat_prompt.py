"""Chat messages, tools and past tool calls into the model's prompt through its chat template.

A template that renders ``tools`` itself gets them, with assistant ``tool_calls`` (arguments as objects, as
Hugging Face templates expect) and ``tool`` messages as they are. A template that does not (SmolLM2's) gets them
written by the tool-call parser in the model family's format: the tools in the system message, past calls in the
assistant's content, and tool results wrapped as that format wraps them.
"""

import json

import jinja2

from server.api import json_text
from server.api.errors import invalid_request
from server.api.protocol import ChatMessage, Tool
from server.api.tool_parsers import ToolParser
from server.models.tokenizer import Tokenizer


def render_chat(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    tools: list[Tool],
    parser: ToolParser,
    add_generation_prompt: bool = True,
) -> str:
    """Blocking: run it in the tokenizer pool. Raises APIError 400 when the template cannot render them."""
    tool_dicts = [tool.model_dump(exclude_none=True) for tool in tools]
    try:
        if tokenizer.template_takes_tools:
            return tokenizer.apply_chat_template([_template_message(m) for m in messages], add_generation_prompt,
                                                 tools=tool_dicts or None)
        return tokenizer.apply_chat_template(_written_out(messages, tool_dicts, parser), add_generation_prompt)
    except (jinja2.TemplateError, ValueError, TypeError) as error:
        raise invalid_request(f"the chat template cannot render these messages: {error}", param="messages") from None


def _template_message(message: ChatMessage) -> dict:
    rendered: dict = {"role": message.role, "content": message.text}
    if message.name:
        rendered["name"] = message.name
    if message.tool_calls:
        rendered["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments_value(call.function.arguments)}}
            for call in message.tool_calls
        ]
    if message.tool_call_id:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _written_out(messages: list[ChatMessage], tools: list[dict], parser: ToolParser) -> list[dict]:
    rendered = []
    for message in messages:
        content = message.text
        if message.tool_calls:
            calls = [parser.format_call(c.function.name, c.function.arguments) for c in message.tool_calls]
            content = "\n".join([content, *calls] if content else calls)
        elif message.role == "tool":
            content = parser.format_result(content)
        rendered.append({"role": message.role, "content": content} | ({"name": message.name} if message.name else {}))
    if tools:
        offer = parser.tools_prompt(tools)
        if rendered[0]["role"] == "system":
            rendered[0]["content"] = f"{rendered[0]['content']}\n\n{offer}" if rendered[0]["content"] else offer
        else:
            rendered.insert(0, {"role": "system", "content": offer})
    return rendered


def _arguments_value(arguments: str) -> object:
    try:
        return json_text.loads(arguments)
    except json.JSONDecodeError:
        return arguments
