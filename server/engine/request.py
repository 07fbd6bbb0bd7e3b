"""A request's parameters, state and outputs: the values that travel between the engine's parts."""

import enum
import time
from dataclasses import dataclass, field

from server.engine.constraint import TokenConstraint
from server.engine.repetition import RepetitionDetector

MAX_STOP_SEQUENCES = 16
# Below this, dividing logits by the temperature overflows float32: such a temperature is greedy in all but name.
GREEDY_BELOW_TEMPERATURE = 1e-5
PENALTY_BOUNDS = (-2.0, 2.0)  # presence and frequency penalties, as OpenAI's
# A repetition penalty near 0 would divide logits into infinity.
REPETITION_PENALTY_BOUNDS = (0.01, 10.0)
# Requests the server makes of itself (readiness canaries) carry this id prefix; telemetry leaves them out.
INTERNAL_REQUEST_PREFIX = "vigil-internal-"
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20  # top alternatives per token, as vLLM's default --max-logprobs
LOGIT_BIAS_BOUNDS = (-100.0, 100.0)  # as OpenAI's
MAX_LOGIT_BIAS_ENTRIES = 1024


@dataclass
class SamplingParams:
    """How to pick tokens and when to stop. Defaults follow vLLM's."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int | None = 16
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # The sampled token's logprob plus this many top alternatives, per output token; None: no logprobs.
    logprobs: int | None = None
    # The same for every prompt token but the first (which nothing predicts); None: none.
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
        )

    def verify(self, vocab_size: int) -> None:
        """Raise ValueError, naming the parameter, for any value the engine cannot honour."""
        checks = [
            ("temperature", self.temperature >= 0.0, "must be >= 0"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k >= -1, "must be -1 (disabled) or >= 0"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be at least 1"),
            ("presence_penalty", _within(self.presence_penalty, PENALTY_BOUNDS), _range(PENALTY_BOUNDS)),
            ("frequency_penalty", _within(self.frequency_penalty, PENALTY_BOUNDS), _range(PENALTY_BOUNDS)),
            (
                "repetition_penalty",
                _within(self.repetition_penalty, REPETITION_PENALTY_BOUNDS),
                _range(REPETITION_PENALTY_BOUNDS),
            ),
            ("stop", len(self.stop) <= MAX_STOP_SEQUENCES, f"allows at most {MAX_STOP_SEQUENCES} strings"),
            ("stop", all(self.stop), "strings must not be empty"),
            (
                "stop_token_ids",
                len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
                f"allows at most {MAX_STOP_TOKEN_IDS} ids",
            ),
            (
                "stop_token_ids",
                all(0 <= t < vocab_size for t in self.stop_token_ids),
                f"must lie in [0, {vocab_size})",
            ),
            ("logprobs", _is_count(self.logprobs, MAX_LOGPROBS), f"must be in [0, {MAX_LOGPROBS}]"),
            ("prompt_logprobs", _is_count(self.prompt_logprobs, MAX_LOGPROBS), f"must be in [0, {MAX_LOGPROBS}]"),
            ("logit_bias", len(self.logit_bias) <= MAX_LOGIT_BIAS_ENTRIES, f"allows {MAX_LOGIT_BIAS_ENTRIES} entries"),
            ("logit_bias", all(0 <= t < vocab_size for t in self.logit_bias), f"ids must lie in [0, {vocab_size})"),
            ("logit_bias", all(_within(b, LOGIT_BIAS_BOUNDS) for b in self.logit_bias.values()),
             "values " + _range(LOGIT_BIAS_BOUNDS)),
        ]
        for name, ok, message in checks:
            if not ok:
                raise InvalidRequestError(f"{name} {message}", param=name)


def _within(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _is_count(value: int | None, most: int) -> bool:
    return value is None or 0 <= value <= most


def _range(bounds: tuple[float, float]) -> str:
    return f"must be in [{bounds[0]:g}, {bounds[1]:g}]"


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


class InvalidRequestError(ValueError):
    """A request the engine refuses; ``param`` names the offending field, ``code`` is OpenAI's error code if any."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the caller should retry later."""


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


@dataclass
class RequestTimes:
    """Monotonic timestamps (``time.monotonic()``) of a request's life; None until reached."""

    arrival: float = field(default_factory=time.monotonic)
    queued: float | None = None
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None


@dataclass
class Request:
    """One sequence as the engine tracks it. ``n > 1`` is fanned out into several of these upstream."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    prompt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: str | int | None = None
    times: RequestTimes = field(default_factory=RequestTimes)
    repetition: RepetitionDetector | None = None
    # Requests share prefix-cache blocks only with requests of the same salt (vLLM's cache_salt).
    cache_salt: str = ""
    # Which tokens may come next (structured output); None: any.
    constraint: TokenConstraint | None = None
    # Guesses at the next output tokens (speculative decoding), checked by the next step's forward.
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def internal(self) -> bool:
        """Made by the server itself (a readiness canary), not by a client."""
        return self.request_id.startswith(INTERNAL_REQUEST_PREFIX)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, position: int) -> int:
        prompt_len = len(self.prompt_token_ids)
        if position < prompt_len:
            return self.prompt_token_ids[position]
        return self.output_token_ids[position - prompt_len]


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log probability, and the ``top`` most likely tokens at its position as (token id, logprob),
    most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class CompletionOutput:
    """One choice of a request: cumulative text and tokens, plus what is new since the last output. ``logprobs``
    (one per output token) only when the request asked for them."""

    index: int
    text: str
    token_ids: list[int]
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprob] | None = None
    delta_logprobs: list[TokenLogprob] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    # One per prompt token; the first is None (nothing predicts it). Only when the request asked for them.
    prompt_logprobs: list[TokenLogprob | None] | None = None
