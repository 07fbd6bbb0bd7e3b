"""LLMEngine.step(): schedule, run the model, update requests, and hand out outputs and stats."""

import logging
import time
from collections.abc import Callable, Iterable

from server.config import EngineConfig
from server.engine.constraint import TokenConstraint
from server.engine.flops import ModelFlops
from server.engine.model_runner import ModelRunner, ModelRunnerOutput
from server.engine.output_processor import OutputProcessor
from server.engine.repetition import RepetitionDetector
from server.engine.request import (
    CONTEXT_LENGTH_EXCEEDED,
    InvalidRequestError,
    Request,
    RequestOutput,
    RequestStatus,
    SamplingParams,
)
from server.engine.scheduler import Scheduler, SchedulerOutput
from server.engine.spec_decode.proposers import can_speculate, draft_policy_for, proposer_for
from server.engine.stats import CacheInfo, EngineInfo, FinishedRequestStats, RequestEvent, StepStats
from server.models.config import ModelConfig
from server.models.tokenizer import Tokenizer

logger = logging.getLogger("vigil.engine")

StatsListener = Callable[[StepStats], None]


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        tokenizer: Tokenizer,
        scheduler: Scheduler,
        runner: ModelRunner,
        cache_info: CacheInfo,
        info: EngineInfo,
        max_model_len: int,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.runner = runner
        self.cache_info = cache_info
        self.info = info
        self.max_model_len = max_model_len
        self.output_processor = OutputProcessor(tokenizer)
        self.model_flops = ModelFlops.of(model_config)
        self.requests: dict[str, Request] = {}
        self.proposer = proposer_for(config.speculative_config)
        self.draft_policy = draft_policy_for(config.speculative_config)
        self.stats_listeners: list[StatsListener] = []
        self._pending_events: list[RequestEvent] = []
        self._pending_finished: list[FinishedRequestStats] = []
        self._pending_first_tokens: dict[str, float] = {}

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = set(self.model_config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    def has_work(self) -> bool:
        """Requests to run, or requests ended (aborted, say) that no step has reported to the stats listeners:
        a step with nothing to run still reports them, and the pool's state after them."""
        return self.scheduler.has_unfinished or bool(self._pending_finished)

    @property
    def max_prompt_chars(self) -> int:
        """No text longer than this can fit the context: not even made of the vocabulary's longest tokens."""
        return self.max_model_len * self.tokenizer.max_token_chars

    def check_prompt_length(self, text: str) -> None:
        """Refuse a text too long to fit the context: by its length alone where it can, else by counting its
        tokens a chunk at a time, stopping once the count is past the context (never tokenizing much more)."""
        if len(text) > self.max_prompt_chars:
            raise self._context_exceeded(f"the prompt has {len(text)} characters, and no text over "
                                         f"{self.max_prompt_chars} fits in that many tokens")
        if self.tokenizer.long_text_exceeds(text, self.max_model_len):
            raise self._context_exceeded(f"the prompt has more than {self.max_model_len} tokens")

    def _context_exceeded(self, however: str, param: str = "prompt", shorten: str = "the prompt"
                          ) -> InvalidRequestError:
        """OpenAI's wording, which clients (LiteLLM) recognise by "maximum context length"."""
        return InvalidRequestError(
            f"This model's maximum context length is {self.max_model_len} tokens. However, {however}. Please "
            f"reduce the length of {shorten}.",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        cache_salt: str = "",
        constraint: TokenConstraint | None = None,
    ) -> Request:
        """Validate and tokenize; raises InvalidRequestError naming the offending parameter. A text prompt too
        long to fit is refused before it is tokenized whole (``check_prompt_length``)."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
        params.verify(self.vocab_size)
        if isinstance(prompt, str):
            self.check_prompt_length(prompt)
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in token_ids):
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})", param="prompt")
        room = self.max_model_len - len(token_ids)
        if room < 1:
            raise self._context_exceeded(
                f"the prompt has {len(token_ids)} tokens, which leaves no room for a completion")
        if params.max_tokens is not None and params.max_tokens > room:
            raise self._context_exceeded(
                f"you requested {len(token_ids) + params.max_tokens} tokens ({len(token_ids)} in the prompt, "
                f"{params.max_tokens} for the completion)",
                param="max_tokens", shorten="the prompt or of the completion",
            )
        request = Request(
            request_id=request_id,
            prompt_token_ids=token_ids,
            sampling_params=params,
            max_tokens=params.max_tokens or room,
            eos_token_ids=self.eos_token_ids,
            prompt=prompt if isinstance(prompt, str) else None,
            repetition=RepetitionDetector() if self.config.stop_on_repetition else None,
            cache_salt=cache_salt,
            constraint=constraint,
        )
        if arrival_time is not None:
            request.times.arrival = arrival_time
        return request

    def add_request(self, request: Request) -> None:
        """Queue a request made by make_request; raises QueueFullError when the queue is at its bound."""
        self.scheduler.add_request(request)
        self.requests[request.request_id] = request
        self.output_processor.add_request(request)
        self._pending_events.append(RequestEvent(request.request_id, "queued", request.times.queued))

    def abort_request(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is None:
            return
        self.scheduler.finish_request(request, RequestStatus.FINISHED_ABORTED)
        self._retire(request)

    def step(self) -> list[RequestOutput]:
        started = time.monotonic()
        scheduled = self.scheduler.schedule()
        outputs: list[RequestOutput] = []
        received: list[tuple[Request, int]] = []
        inter_token_latencies: list[float] = []
        accepted_lengths: list[int] = []
        if not scheduled.is_empty:
            ran = self.runner.execute(scheduled)
            self._record_logprobs(scheduled, ran)
            received = self.scheduler.update_from_output(scheduled, ran.sampled)
            accepted_lengths = ran.accepted_lengths
            inter_token_latencies = self._stamp_tokens([request for request, _ in received])
            outputs = [self._process(request, count) for request, count in received]
            if self.proposer is not None:
                self._learn(scheduled, ran.sampled)
                self._propose(request for request, _ in received)
                if all(item.is_decode for item in scheduled.scheduled):
                    self.draft_policy.step_times.observe(scheduled.num_scheduled_tokens, time.monotonic() - started)
        if self.stats_listeners and (not scheduled.is_empty or self._pending_finished):
            stats = self._step_stats(scheduled, received, inter_token_latencies, accepted_lengths, started)
            for listener in self.stats_listeners:
                listener(stats)
        self._pending_events.clear()
        self._pending_finished.clear()
        self._pending_first_tokens.clear()
        return outputs

    def _record_logprobs(self, scheduled: SchedulerOutput, ran: ModelRunnerOutput) -> None:
        for request_id, found in ran.prompt_logprobs.items():
            self.output_processor.add_prompt_logprobs(request_id, found.first_position, found.entries)
        for item, entry in zip(scheduled.scheduled, ran.logprobs, strict=True):
            if entry is not None:
                self.output_processor.add_logprobs(item.request.request_id, entry)

    def _stamp_tokens(self, received: list[Request]) -> list[float]:
        """Record token times; returns this step's inter-token latencies."""
        now = time.monotonic()
        inter_token_latencies: list[float] = []
        for request in received:
            times = request.times
            if times.first_token is None:
                times.first_token = now
                self._pending_events.append(RequestEvent(request.request_id, "first_token", now))
                if not request.internal:
                    self._pending_first_tokens[request.request_id] = now - times.arrival
            else:
                inter_token_latencies.append(now - times.last_token)
            times.last_token = now
        return inter_token_latencies

    def _learn(self, scheduled: SchedulerOutput, sampled: list[list[int]]) -> None:
        """Each request's guesses kept this step (all but its last new token), for the draft policy."""
        for item, tokens in zip(scheduled.scheduled, sampled, strict=True):
            if item.spec_token_ids:
                self.draft_policy.observe_verification(item.request.request_id, len(item.spec_token_ids),
                                                       len(tokens) - 1)

    def _propose(self, requests: Iterable[Request]) -> None:
        """Guesses at each running request's next tokens, for the next step to check: as many as the draft policy
        expects to pay, never past the request's limits."""
        self.draft_policy.start_step(len(self.scheduler.running))
        for request in requests:
            if request.status != RequestStatus.RUNNING or not can_speculate(request):
                continue
            room = min(request.max_tokens - len(request.output_token_ids), self.max_model_len - request.num_tokens)
            wanted = self.draft_policy.num_guesses(request.request_id, room - 1)
            if wanted:
                request.spec_token_ids = self.proposer.propose(request.all_token_ids, wanted, request.request_id)
                self.draft_policy.proposed(request.request_id, len(request.spec_token_ids))

    def _process(self, request: Request, num_new_tokens: int) -> RequestOutput:
        """Detokenize the request's newest tokens, one at a time: a stop string ends it at the token that
        completes it, and tokens past that (kept guesses) are dropped."""
        first = len(request.output_token_ids) - num_new_tokens
        stop = None
        for index in range(first, len(request.output_token_ids)):
            last = index == len(request.output_token_ids) - 1
            stop = self.output_processor.update_text(request, request.output_token_ids[index], last)
            if stop is not None:
                del request.output_token_ids[index + 1 :]
                break
        if stop is not None and not request.status.finished:
            self.scheduler.finish_request(request, RequestStatus.FINISHED_STOPPED, stop)
        elif stop is not None:
            request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        output = self.output_processor.make_output(request)
        if request.status.finished:
            self._retire(request)
        return output

    def _retire(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        if self.draft_policy is not None:
            self.draft_policy.forget(request.request_id)
        if self.proposer is not None:
            self.proposer.forget(request.request_id)
        self.output_processor.remove_request(request.request_id)
        if self.stats_listeners and not request.internal:
            self._pending_finished.append(finished_stats(request))

    def _step_stats(
        self,
        scheduled: SchedulerOutput,
        received: list[tuple[Request, int]],
        inter_token_latencies: list[float],
        accepted_lengths: list[int],
        started: float,
    ) -> StepStats:
        now = time.monotonic()
        events = list(self._pending_events)
        events += [RequestEvent(r.request_id, "scheduled", r.times.scheduled) for r in scheduled.newly_scheduled
                   if r.times.scheduled is not None and r.times.scheduled >= started]
        events += [RequestEvent(r.request_id, "preempted", now) for r in scheduled.preempted]
        events.sort(key=lambda e: e.timestamp)
        prompt_tokens = sum(s.num_prompt_tokens for s in scheduled.scheduled if not s.request.internal)
        num_decode = sum(1 for s in scheduled.scheduled if s.is_decode)
        block_manager = self.scheduler.block_manager
        running = self.scheduler.running
        blocks_held = sum(len(block_manager.block_ids(r.request_id)) for r in running)
        return StepStats(
            timestamp=now,
            step_duration_s=now - started,
            num_running=len(running),
            num_waiting=len(self.scheduler.waiting),
            num_kv_blocks_used=block_manager.num_used_blocks,
            num_kv_blocks_total=block_manager.num_blocks,
            num_kv_slots_held=blocks_held * block_manager.block_size,
            num_kv_slots_filled=sum(r.num_computed_tokens for r in running),
            num_scheduled_tokens=scheduled.num_scheduled_tokens,
            num_prefill_seqs=len(scheduled.scheduled) - num_decode,
            num_decode_seqs=num_decode,
            num_preemptions=len(scheduled.preempted),
            prefix_cache_queries=scheduled.prefix_cache_queries,
            prefix_cache_hits=scheduled.prefix_cache_hits,
            num_prompt_tokens=prompt_tokens,
            num_generation_tokens=sum(count for request, count in received if not request.internal),
            num_draft_tokens=sum(len(s.spec_token_ids) for s in scheduled.scheduled),
            accepted_lengths=accepted_lengths,
            model_flops=self.model_flops.of_step(scheduled),
            inter_token_latencies_s=inter_token_latencies,
            time_to_first_token_s=dict(self._pending_first_tokens),
            rank_step_durations_s=self.runner.model.rank_step_durations_s,
            events=events,
            finished=list(self._pending_finished),
        )


def finished_stats(request: Request) -> FinishedRequestStats:
    times = request.times
    return FinishedRequestStats(
        request_id=request.request_id,
        finish_reason=request.status.value,
        stop_reason=request.stop_reason,
        arrival_time=times.arrival,
        queued_time=times.queued,
        scheduled_time=times.scheduled,
        first_token_time=times.first_token,
        last_token_time=times.last_token,
        finished_time=times.finished or time.monotonic(),
        num_prompt_tokens=request.num_prompt_tokens,
        num_generation_tokens=len(request.output_token_ids),
        num_cached_tokens=request.num_cached_tokens,
        num_preemptions=request.num_preemptions,
        max_tokens=request.max_tokens,
        sampling_params=request.sampling_params,
        output_token_ids=tuple(request.output_token_ids),
    )
