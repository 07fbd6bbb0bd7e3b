"""Routing policies: which served model an alias (such as ``auto``) sends a request to.

A policy is a small object with ``models`` (those it may choose) and ``choose(request, waiting)``, which returns the
model and a reason from a closed set (``vigil_router_decisions_total``'s ``reason`` label). It sees the request's
prompt, its length and its ``max_tokens``, and the load: ``waiting(model)``, how many requests wait in that model's
queue. To add a policy, write a class with those two members and name it in ``POLICIES``; a model config file picks
it with ``policy = "<name>"`` and passes the rest of its ``[[alias]]`` table to it as keyword arguments.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class RoutingRequest:
    """What a policy may judge a request by, known before tokenizing (each model has its own tokenizer)."""

    text: str  # the prompt, or the chat messages' contents joined
    prompt_chars: int  # characters of the prompt; 4 per token for a prompt sent as token ids
    max_tokens: int | None  # as requested; None when the client left it to the server


@dataclass(frozen=True)
class RoutingDecision:
    model: str
    reason: str  # one of telemetry.metrics.ROUTING_REASONS


class RoutingPolicy(Protocol):
    models: tuple[str, ...]

    def choose(self, request: RoutingRequest, waiting: Callable[[str], int]) -> RoutingDecision: ...


@dataclass(frozen=True)
class SmallFirstPolicy:
    """Everything goes to ``small`` unless it looks hard: a prompt longer than ``max_small_prompt_chars``, more than
    ``max_small_tokens`` asked for, or text matching one of ``hard_patterns`` (regular expressions, case-insensitive).
    A hard request goes to ``large``, except that while ``large`` has ``overflow_waiting`` or more requests waiting
    it overflows to ``small`` (never, when ``overflow_waiting`` is None)."""

    small: str
    large: str
    max_small_prompt_chars: int = 2000
    max_small_tokens: int = 256
    hard_patterns: tuple[str, ...] = ()
    overflow_waiting: int | None = None
    _compiled: tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.small == self.large:
            raise ValueError("a routing alias needs two different models, small and large")
        if self.overflow_waiting is not None and self.overflow_waiting < 1:
            raise ValueError("overflow_waiting must be positive")
        try:
            compiled = tuple(re.compile(pattern, re.IGNORECASE) for pattern in self.hard_patterns)
        except re.error as error:
            raise ValueError(f"hard_patterns: {error}") from None
        object.__setattr__(self, "_compiled", compiled)

    @property
    def models(self) -> tuple[str, ...]:
        return (self.small, self.large)

    def choose(self, request: RoutingRequest, waiting: Callable[[str], int]) -> RoutingDecision:
        reason = self._hard_reason(request)
        if reason is None:
            return RoutingDecision(self.small, "simple")
        if self.overflow_waiting is not None and waiting(self.large) >= self.overflow_waiting:
            return RoutingDecision(self.small, "overflow")
        return RoutingDecision(self.large, reason)

    def _hard_reason(self, request: RoutingRequest) -> str | None:
        if request.prompt_chars > self.max_small_prompt_chars:
            return "long_prompt"
        if request.max_tokens is not None and request.max_tokens > self.max_small_tokens:
            return "long_output"
        if any(pattern.search(request.text) for pattern in self._compiled):
            return "hard_rule"
        return None


POLICIES: dict[str, type] = {"small_first": SmallFirstPolicy}


def make_policy(name: str, settings: dict) -> RoutingPolicy:
    """The policy ``name`` of POLICIES with ``settings`` (a config file's table); raises ValueError for the user."""
    if name not in POLICIES:
        raise ValueError(f"unknown routing policy {name!r} (known: {', '.join(sorted(POLICIES))})")
    try:
        return POLICIES[name](**{key: tuple(v) if isinstance(v, list) else v for key, v in settings.items()})
    except TypeError as error:
        raise ValueError(f"routing policy {name!r}: {error}") from None
