"""Turns new tokens into text deltas, applies stop strings, and shapes RequestOutputs."""

from dataclasses import dataclass

from server.engine.request import CompletionOutput, Request, RequestOutput, TokenLogprob
from server.models.detokenizer import IncrementalDetokenizer
from server.models.tokenizer import Tokenizer


@dataclass
class _TextState:
    detokenizer: IncrementalDetokenizer
    text: str = ""
    emitted_chars: int = 0
    emitted_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per output token, when asked
    prompt_logprobs: list[TokenLogprob | None] | None = None  # one per prompt token so far, when asked


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, _TextState] = {}

    def add_request(self, request: Request) -> None:
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, request.prompt_token_ids, request.sampling_params.skip_special_tokens
        )
        params = request.sampling_params
        self._states[request.request_id] = _TextState(
            detokenizer,
            logprobs=[] if params.logprobs is not None else None,
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )

    def remove_request(self, request_id: str) -> None:
        self._states.pop(request_id, None)

    def add_logprobs(self, request_id: str, entry: TokenLogprob) -> None:
        """The logprobs of the request's newest output token."""
        state = self._states.get(request_id)
        if state is not None and state.logprobs is not None:
            state.logprobs.append(entry)

    def add_prompt_logprobs(self, request_id: str, first_position: int, entries: list[TokenLogprob]) -> None:
        """Prompt logprobs from ``first_position`` on; positions already known (computed again after a preemption)
        are kept as they were."""
        state = self._states.get(request_id)
        if state is not None and state.prompt_logprobs is not None:
            state.prompt_logprobs += entries[len(state.prompt_logprobs) - first_position :]

    def update_text(self, request: Request, token: int, last: bool) -> str | None:
        """Detokenize one new token of the request; returns the stop string it completed, if any. ``last``: no
        more tokens come in this step (if the request has finished, what the detokenizer holds back is flushed)."""
        state = self._states[request.request_id]
        checked_chars = len(state.text)
        state.text += state.detokenizer.add_token(token)
        if last and request.status.finished:
            state.text += state.detokenizer.flush()
        stops = request.sampling_params.stop
        if not stops:
            return None
        longest = max(len(s) for s in stops)
        window_start = max(0, checked_chars - longest + 1)
        hits = [(state.text.find(s, window_start), s) for s in stops]
        hits = [(index, s) for index, s in hits if index >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        state.text = state.text[:index]
        return stop

    def make_output(self, request: Request) -> RequestOutput:
        """The request's output so far; text that might yet become a stop string is held back."""
        state = self._states[request.request_id]
        finished = request.status.finished
        visible = len(state.text)
        if not finished and request.sampling_params.stop:
            visible -= max(len(s) for s in request.sampling_params.stop) - 1
        visible = max(visible, state.emitted_chars)
        completion = CompletionOutput(
            index=0,
            text=state.text[:visible],
            token_ids=list(request.output_token_ids),
            delta_text=state.text[state.emitted_chars : visible],
            delta_token_ids=request.output_token_ids[state.emitted_tokens :],
            finish_reason=request.status.value if finished else None,
            stop_reason=request.stop_reason,
            logprobs=list(state.logprobs) if state.logprobs is not None else None,
            delta_logprobs=state.logprobs[state.emitted_tokens :] if state.logprobs is not None else None,
        )
        state.emitted_chars = visible
        state.emitted_tokens = len(request.output_token_ids)
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=request.num_cached_tokens,
            prompt_logprobs=state.prompt_logprobs,
        )
