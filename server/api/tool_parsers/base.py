"""What every tool-call parser offers: reading calls out of generated text, at once or as it streams, and writing
tools, past calls and their results into a prompt whose chat template cannot."""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class ParsedText:
    """What a piece of generated text holds: plain content, and the tool calls completed in it."""

    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)

    def __iadd__(self, other: "ParsedText") -> "ParsedText":
        self.content += other.content
        self.tool_calls += other.tool_calls
        return self


class ToolCallStream(ABC):
    """One choice's text as it arrives. Text that may yet turn out to be part of a call is held back."""

    @abstractmethod
    def feed(self, text: str) -> ParsedText: ...

    @abstractmethod
    def finish(self) -> ParsedText:
        """The end of the text: whatever was held back."""


class ToolParser(ABC):
    @abstractmethod
    def stream(self) -> ToolCallStream: ...

    def extract(self, text: str) -> ParsedText:
        """The whole text at once: the same reading as streaming it."""
        stream = self.stream()
        parsed = stream.feed(text)
        parsed += stream.finish()
        return parsed

    @abstractmethod
    def tools_prompt(self, tools: list[dict]) -> str:
        """System-prompt text that offers ``tools`` (OpenAI tool objects) in the model's format."""

    @abstractmethod
    def format_call(self, name: str, arguments: str) -> str:
        """A past call, as the model would have written it."""

    @abstractmethod
    def format_result(self, content: str) -> str:
        """A tool's result, as the model expects to read it."""

    @abstractmethod
    def calls_grammar(self, tools: list[dict], parallel: bool, json_options: dict) -> str:
        """Lark rules whose rule ``calls`` is one call of ``tools`` (OpenAI tool objects) in the model's format, or
        several when ``parallel``; each call's JSON is written with llguidance's ``json_options``."""
