"""Continuous batching in tokens: running requests first, then waiting ones, under one token budget."""

import time
from collections import deque
from dataclasses import dataclass, field

from server.engine.block_manager import NO_PREFIX, BlockManager, CachedPrefix
from server.engine.request import QueueFullError, Request, RequestStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_queue_len: int


@dataclass(frozen=True)
class ScheduledRequest:
    """``num_new_tokens`` of ``request``, starting at position ``start``, run in this step over the KV blocks
    ``block_ids``. The last ``len(spec_token_ids)`` of them are speculative guesses at its next tokens."""

    request: Request
    start: int
    num_new_tokens: int
    samples: bool
    block_ids: list[int]
    spec_token_ids: tuple[int, ...] = ()

    @property
    def feeds_one_token(self) -> bool:
        """One known token, and any guesses riding along: each of its rows attends as a decode row does."""
        return self.num_new_tokens - len(self.spec_token_ids) == 1

    @property
    def is_decode(self) -> bool:
        """One new token past the prompt (and any guesses that ride along)."""
        return self.feeds_one_token and self.start >= self.request.num_prompt_tokens

    @property
    def num_prompt_tokens(self) -> int:
        """How many of this step's tokens are prompt tokens computed for the first time or again."""
        return max(0, min(self.start + self.num_new_tokens, self.request.num_prompt_tokens) - self.start)


@dataclass
class SchedulerOutput:
    """One step's work. Requests that feed one token (with any guesses) come first, longer chunks after them."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    newly_scheduled: list[Request] = field(default_factory=list)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add_request(self, request: Request) -> None:
        if len(self.waiting) >= self.config.max_queue_len:
            raise QueueFullError(f"the waiting queue is full ({self.config.max_queue_len} requests)")
        request.status = RequestStatus.WAITING
        request.times.queued = time.monotonic()
        self.waiting.append(request)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        budget = self._schedule_running(output, budget)
        if not output.preempted:
            self._schedule_waiting(output, budget)
        output.scheduled.sort(key=lambda s: not s.feeds_one_token)
        return output

    def _schedule_running(self, output: SchedulerOutput, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            # Guesses ride along only with a decode, and only as far as the budget goes.
            drafts = tuple(request.spec_token_ids[: budget - 1]) if num_new == 1 else ()
            num_new += len(drafts)
            while not self.block_manager.allocate_slots(request.request_id, request.num_computed_tokens + num_new):
                victim = self.running.pop()
                self._preempt(victim)
                output.preempted.append(victim)
                if victim is request:
                    break
            else:
                output.scheduled.append(self._scheduled(request, num_new, drafts))
                budget -= num_new
                index += 1
        return budget

    def _schedule_waiting(self, output: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            prefix = self._cached_prefix(request)
            num_new = min(request.num_tokens - prefix.num_tokens, budget)
            if not self.block_manager.allocate_slots(request.request_id, prefix.num_tokens + num_new, prefix):
                break
            self.waiting.popleft()
            request.num_computed_tokens = request.num_cached_tokens = prefix.num_tokens
            output.prefix_cache_queries += request.num_tokens
            output.prefix_cache_hits += prefix.num_tokens
            request.status = RequestStatus.RUNNING
            if request.times.scheduled is None:
                request.times.scheduled = time.monotonic()
            self.running.append(request)
            output.newly_scheduled.append(request)
            output.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new

    def _cached_prefix(self, request: Request) -> CachedPrefix:
        """A request that wants its prompt's logprobs computes every prompt position itself, as in vLLM."""
        if request.sampling_params.prompt_logprobs is not None:
            return NO_PREFIX
        return self.block_manager.find_cached_prefix(request.all_token_ids, request.cache_salt)

    def _scheduled(self, request: Request, num_new_tokens: int, drafts: tuple[int, ...] = ()) -> ScheduledRequest:
        start = request.num_computed_tokens
        return ScheduledRequest(
            request, start, num_new_tokens, start + num_new_tokens - len(drafts) == request.num_tokens,
            self.block_manager.block_ids(request.request_id), drafts,
        )

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: the request loses its blocks and goes back to the front of the line."""
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.num_cached_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def finish_request(self, request: Request, status: RequestStatus, stop_reason: str | int | None = None) -> None:
        """End a request wherever it is and give its blocks back."""
        if request.status.finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        request.stop_reason = stop_reason
        request.times.finished = time.monotonic()
        self.block_manager.free(request.request_id)

    def update_from_output(self, output: SchedulerOutput, sampled: list[list[int]]) -> list[tuple[Request, int]]:
        """Advance the scheduled requests past this step: each gets the tokens sampled for it (none for a chunk
        that is not up to date yet; with guesses, the guesses kept and one more), up to the first that stops it.
        Returns each request that received tokens, with how many."""
        received: list[tuple[Request, int]] = []
        for item, tokens in zip(output.scheduled, sampled, strict=True):
            request = item.request
            if request.status != RequestStatus.RUNNING:
                continue
            if item.spec_token_ids:
                # The K/V of the kept guesses is computed; the rejected guesses' slots are given back.
                request.num_computed_tokens += item.num_new_tokens - len(item.spec_token_ids) + len(tokens) - 1
                self.block_manager.trim(request.request_id, request.num_computed_tokens)
            else:
                request.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(request, request.num_computed_tokens)
            request.spec_token_ids = []
            before = len(request.output_token_ids)
            for token in tokens:
                request.output_token_ids.append(token)
                if request.constraint is not None:
                    request.constraint.accept_token(token)
                stop = token_stop(request, token)
                if stop is not None:
                    self.finish_request(request, *stop)
                    break
            if tokens:
                received.append((request, len(request.output_token_ids) - before))
        return received


def token_stop(request: Request, token: int) -> tuple[RequestStatus, int | str | None] | None:
    """Stop conditions that need no text: EOS, stop token ids, a completed grammar, a repetition loop, and the
    length limit."""
    params = request.sampling_params
    if not params.ignore_eos and token in request.eos_token_ids:
        return RequestStatus.FINISHED_STOPPED, None
    if token in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED, token
    if request.constraint is not None and request.constraint.is_finished():
        return RequestStatus.FINISHED_STOPPED, None
    if request.repetition is not None and request.repetition.add(token):
        return RequestStatus.FINISHED_STOPPED, "repetition"
    if len(request.output_token_ids) >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH, None
    return None
