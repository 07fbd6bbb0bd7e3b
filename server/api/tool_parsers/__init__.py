"""Tool-call parsers by name, chosen with ``--tool-call-parser`` as in vLLM."""

from server.api.tool_parsers.base import ParsedText, ParsedToolCall, ToolCallStream, ToolParser
from server.api.tool_parsers.hermes import HermesToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser}

__all__ = ["TOOL_PARSERS", "ParsedText", "ParsedToolCall", "ToolCallStream", "ToolParser"]
