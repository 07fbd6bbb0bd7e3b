"""The Hermes tool-call parser: whole texts and the same texts streamed in any pieces read alike."""

import json

import pytest

from server.api.tool_parsers import TOOL_PARSERS, ParsedText, ParsedToolCall
from server.config_values import TOOL_PARSER_NAMES

PARSER = TOOL_PARSERS["hermes"]()
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
WEATHER = ParsedToolCall("get_weather", json.dumps({"city": "Paris", "unit": "c"}))

CASES = {
    "plain text": ("Hello there, no tools.", "Hello there, no tools.", []),
    "one call": (CALL, "", [WEATHER]),
    "content then a call": ("Let me check.\n" + CALL, "Let me check.\n", [WEATHER]),
    "two calls": (CALL + "\n" + CALL.replace("Paris", "Rome"), "",
                  [WEATHER, ParsedToolCall("get_weather", json.dumps({"city": "Rome", "unit": "c"}))]),
    "a call never closed": (CALL.removesuffix("</tool_call>"), "", [WEATHER]),
    "not JSON inside the tags stays text": ("<tool_call>oops</tool_call>", "<tool_call>oops</tool_call>", []),
    "a text that only looks like the start of a tag": ("a <tool_ b", "a <tool_ b", []),
    "arguments already a string": ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "",
                                   [ParsedToolCall("f", '{"x": 1}')]),
}


@pytest.mark.parametrize("text, content, calls", CASES.values(), ids=CASES.keys())
def test_whole_texts(text, content, calls):
    parsed = PARSER.extract(text)
    assert parsed.content == content and parsed.tool_calls == calls


@pytest.mark.parametrize("piece", [1, 2, 5, 13])
@pytest.mark.parametrize("text, content, calls", CASES.values(), ids=CASES.keys())
def test_streamed_in_pieces_reads_the_same(text, content, calls, piece):
    stream, parsed = PARSER.stream(), ParsedText()
    for start in range(0, len(text), piece):
        parsed += stream.feed(text[start : start + piece])
    parsed += stream.finish()
    assert parsed.content == content and parsed.tool_calls == calls


def test_no_part_of_a_call_leaks_as_content_while_streaming():
    stream = PARSER.stream()
    leaked = "".join(stream.feed(char).content for char in "Sure. " + CALL)
    assert leaked == "Sure. "


def test_calls_and_results_are_written_back_in_the_same_format():
    written = PARSER.format_call("get_weather", '{"city": "Paris", "unit": "c"}')
    assert PARSER.extract(written).tool_calls == [WEATHER]
    assert "<tool_response>" in PARSER.format_result("18 C")
    assert '"name": "get_weather"' in PARSER.tools_prompt([{"type": "function", "function": {"name": "get_weather"}}])


def test_the_flag_offers_exactly_the_parsers_there_are():
    assert sorted(TOOL_PARSERS) == sorted(TOOL_PARSER_NAMES)
