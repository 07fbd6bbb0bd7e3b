"""The OpenAI schema: request bodies (strictly typed, unknown fields ignored) and response bodies."""

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from server.engine.request import (
    MAX_LOGPROBS,
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
MAX_GUIDED_CHOICES = 1024
MAX_TOOLS = 128
DEFAULT_COMPLETION_TOKENS = 16
LEGACY_CALL_ID = "call_legacy"


def _encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it holds a lone surrogate)") from None
    return value


def _token_id_keys(bias: dict[str, float]) -> dict[int, float]:
    try:
        return {int(token_id): value for token_id, value in bias.items()}
    except ValueError:
        raise ValueError("keys must be token ids, written as decimal strings") from None


Text = Annotated[str, AfterValidator(_encodable)]
StopText = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_LENGTH)]
TokenIds = list[int]
LogitBias = Annotated[dict[str, float], AfterValidator(_token_id_keys)]
JSONObject = dict[str, Any]


class RequestModel(BaseModel):
    """Strict types (no "5" for 5, no true for 1, no NaN), and unknown fields ignored as OpenAI clients expect."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(RequestModel):
    include_usage: bool | None = False


class StructuredOutputs(RequestModel):
    """vLLM's ``structured_outputs``: one of these constrains the output."""

    json_: JSONObject | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: Annotated[list[Text], Field(min_length=1, max_length=MAX_GUIDED_CHOICES)] | None = None
    grammar: Text | None = None
    json_object: bool | None = None


class JSONSchemaFormat(RequestModel):
    name: Annotated[Text, Field(max_length=64)] = "response"
    description: Text | None = None
    schema_: JSONObject | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("type json_schema needs json_schema.schema")
        return self


class SamplingRequest(RequestModel):
    """The fields completions and chat share. ``None`` means the default, as some SDKs send nulls."""

    model: Text | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)  # 0, as OpenAI accepts it: greedy
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
    logit_bias: LogitBias | None = None
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: JSONObject | Text | None = None
    guided_regex: Text | None = None
    guided_choice: Annotated[list[Text], Field(min_length=1, max_length=MAX_GUIDED_CHOICES)] | None = None
    guided_grammar: Text | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def num_logprobs(self) -> int | None:
        """How many top alternatives to return per token; None: no logprobs."""
        return None

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        greedy = self.top_p == 0.0
        return SamplingParams(
            temperature=0.0 if greedy else 1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None or greedy else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=self.seed,
            max_tokens=max_tokens,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=bool(self.ignore_eos),
            logprobs=self.num_logprobs,
            logit_bias=dict(self.logit_bias or {}),
        )


class CompletionRequest(SamplingRequest):
    prompt: (
        Text
        | Annotated[list[Text], Field(max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(default=DEFAULT_COMPLETION_TOKENS, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # Accepted only at their defaults: Vigil does not compute these.
    suffix: Text | None = None
    best_of: int | None = None

    @property
    def output_limit(self) -> int:
        """OpenAI's default for a null ``max_tokens`` too (the SDK sends null for None)."""
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        """With ``echo`` and ``logprobs``, the prompt's logprobs too (vLLM's prompt_logprobs)."""
        params = super().sampling_params(max_tokens)
        if self.echo and self.logprobs is not None:
            params.prompt_logprobs = self.logprobs
        return params

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)

    def unsupported_field(self) -> str | None:
        if self.suffix:
            return "suffix"
        if self.best_of is not None and self.best_of != self.num_choices:
            return "best_of"
        return None


class TextPart(RequestModel):
    type: Literal["text"]
    text: Text


class RefusalPart(RequestModel):
    type: Literal["refusal"]
    refusal: Text


class FunctionCall(RequestModel):
    name: Text
    arguments: Text  # JSON text, as OpenAI sends it


class MessageToolCall(RequestModel):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    """Legacy ``function`` messages and an assistant's ``function_call`` are read as a tool result and a tool call;
    an assistant's refusal (its ``refusal`` field or refusal parts) is its text."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Text | Annotated[list[TextPart | RefusalPart], Field(max_length=MAX_MESSAGES)] | None = None
    refusal: Text | None = None
    name: Text | None = None
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_TOOLS)] | None = None
    function_call: FunctionCall | None = None
    tool_call_id: Text | None = None

    @model_validator(mode="after")
    def _has_content(self) -> "ChatMessage":
        if self.role == "function":
            self.role = "tool"
        if self.function_call is not None and self.role == "assistant" and not self.tool_calls:
            self.tool_calls = [MessageToolCall(id=LEGACY_CALL_ID, function=self.function_call)]
        if self.content is None and not (self.role == "assistant" and (self.tool_calls or self.refusal)):
            needs = "content, refusal or tool_calls" if self.role == "assistant" else "content"
            raise ValueError(f"a {self.role} message needs {needs}")
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text if isinstance(part, TextPart) else part.refusal for part in self.content)
        return self.content or self.refusal or ""


class FunctionDefinition(RequestModel):
    name: Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: Text | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: Text


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # OpenAI's deprecated form of tools: served as tools, answered with one ``function_call``.
    functions: Annotated[list[FunctionDefinition], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None

    @property
    def legacy_functions(self) -> bool:
        return self.functions is not None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# --- responses ------------------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """The completions API's logprobs: parallel lists, one entry per token; ``top_logprobs`` maps token text to
    logprob for the most likely tokens and the chosen one. A prompt's first token has None (nothing predicts
    it)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


def _is_none(value: object) -> bool:
    return value is None


def _is_empty(value: list) -> bool:
    return not value


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list, exclude_if=_is_empty)
    function_call: ToolCallFunction | None = Field(default=None, exclude_if=_is_none)  # for legacy ``functions``


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaFunctionCall(BaseModel):
    name: str | None = Field(default=None, exclude_if=_is_none)
    arguments: str | None = Field(default=None, exclude_if=_is_none)


class DeltaToolCall(BaseModel):
    """A tool call's first delta carries its ``id``, ``type`` and name; later ones more of its arguments."""

    index: int
    id: str | None = Field(default=None, exclude_if=_is_none)
    type: Literal["function"] | None = Field(default=None, exclude_if=_is_none)
    function: DeltaFunctionCall


class DeltaMessage(BaseModel):
    """Only what changed: the role in a choice's first chunk, then content or tool calls."""

    role: Literal["assistant"] | None = Field(default=None, exclude_if=_is_none)
    content: str | None = Field(default=None, exclude_if=_is_none)
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=_is_none)
    function_call: DeltaFunctionCall | None = Field(default=None, exclude_if=_is_none)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
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


class TokenizeRequest(RequestModel):
    """vLLM's /tokenize: a ``prompt``, or chat ``messages`` rendered through the chat template."""

    model: Text | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (the template has them)
    add_generation_prompt: bool | None = True
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    return_token_strs: bool | None = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(RequestModel):
    model: Text | None = None
    tokens: TokenIds


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """vLLM's /tokenizer_info, which lm-evaluation-harness reads to tokenize through the server."""

    tokenizer_class: str = "PreTrainedTokenizerFast"
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None = None
    chat_template: str | None
    model_max_length: int


class VersionInfo(BaseModel):
    version: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
