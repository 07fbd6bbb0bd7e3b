"""The OpenAI schema: request bodies (strictly typed, unknown fields ignored) and response bodies."""

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from server.engine.request import (
    MAX_STOP_SEQUENCES,
    MAX_STOP_TOKEN_IDS,
    PENALTY_BOUNDS,
    REPETITION_PENALTY_BOUNDS,
    SamplingParams,
)

MAX_N = 16
MAX_PROMPTS = 64
MAX_CHOICES = 64
MAX_STOP_LENGTH = 256
MAX_MESSAGES = 1024
MAX_CACHE_SALT_LENGTH = 256


def _encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it holds a lone surrogate)") from None
    return value


Text = Annotated[str, AfterValidator(_encodable)]
StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_LENGTH)]
TokenIds = list[int]


class RequestModel(BaseModel):
    """Strict types (no "5" for 5, no true for 1, no NaN), and unknown fields ignored as OpenAI clients expect."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(RequestModel):
    include_usage: bool | None = False


class SamplingRequest(RequestModel):
    """The fields completions and chat share. ``None`` means the default, as some SDKs send nulls."""

    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    n: int | None = Field(default=1, ge=1, le=MAX_N)
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=PENALTY_BOUNDS[0], le=PENALTY_BOUNDS[1])
    frequency_penalty: float | None = Field(default=None, ge=PENALTY_BOUNDS[0], le=PENALTY_BOUNDS[1])
    repetition_penalty: float | None = Field(
        default=None, ge=REPETITION_PENALTY_BOUNDS[0], le=REPETITION_PENALTY_BOUNDS[1]
    )
    ignore_eos: bool | None = False
    user: Text | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    cache_salt: Annotated[Text, Field(max_length=MAX_CACHE_SALT_LENGTH)] | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=self.seed,
            max_tokens=max_tokens,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
        )


class CompletionRequest(SamplingRequest):
    prompt: (
        Text
        | Annotated[list[Text], Field(max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(default=16, ge=1)
    # Accepted only at their defaults: Vigil does not compute these.
    echo: bool | None = False
    logprobs: int | None = None
    suffix: Text | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)

    def unsupported_field(self) -> str | None:
        if self.echo:
            return "echo"
        if self.logprobs is not None:
            return "logprobs"
        if self.suffix:
            return "suffix"
        if self.best_of is not None and self.best_of != self.num_choices:
            return "best_of"
        return None


class TextPart(RequestModel):
    type: Literal["text"]
    text: Text


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=MAX_MESSAGES)] | None = None
    name: Text | None = None

    def as_template_input(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": self.role, "content": content or ""}
        if self.name:
            message["name"] = self.name
        return message


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Accepted only at their defaults: Vigil does not compute these.
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: ResponseFormat | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported_field(self) -> str | None:
        if self.logprobs:
            return "logprobs"
        if self.top_logprobs:
            return "top_logprobs"
        if self.tools:
            return "tools"
        if self.response_format is not None and self.response_format.type != "text":
            return "response_format"
        return None


# --- responses ------------------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


def _is_none(value: object) -> bool:
    return value is None


class DeltaMessage(BaseModel):
    """Only what changed: the role in a choice's first chunk, then content."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_is_none)
    content: str | None = Field(default=None, exclude_if=_is_none)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vigil"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
