"""Turns a batch of logits into one next token per request, with its logprobs where asked."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from server.engine.logprobs import gather_logprobs
from server.engine.request import Request, SamplingParams, TokenLogprob
from server.engine.spec_decode.rejection import verify, verify_greedy


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where the request did not ask


class Sampler:
    """Greedy, temperature, top-k, top-p, per-request seeds, repetition/presence/frequency penalties, logit bias
    and structured-output masks, in one batch.

    Logprobs come from the distribution the token is drawn from, before top-k and top-p: the logits after
    penalties, logit bias and the structured-output mask, divided by the temperature (greedy rows: by 1).

    A seeded request's token at each output position is drawn with a generator of its seed and that position
    alone, so it depends on nothing else: not on the steps before, nor on whether speculation verified it.
    """

    def __init__(self, greedy_tokens: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``greedy_tokens``: each row's first highest logit (the layer ops' kernel)."""
        self._greedy_tokens = greedy_tokens

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        params = [r.sampling_params for r in requests]
        if all(_is_plain_greedy(r) for r in requests):
            return SamplerOutput(self._greedy_tokens(logits).tolist(), [None] * len(requests))
        logits = logits.float()
        for row, request in enumerate(requests):
            if request.sampling_params.has_penalties:
                logits[row] = apply_penalties(logits[row], request)
            if request.sampling_params.logit_bias:
                apply_logit_bias(logits[row], request.sampling_params.logit_bias)
        apply_constraints(logits, requests)
        for row, p in enumerate(params):
            if not p.greedy:
                logits[row] /= p.temperature
        tokens = self._greedy_tokens(logits)
        for row, (request, p) in enumerate(zip(requests, params, strict=True)):
            if not p.greedy:
                probs = torch.softmax(_top_k_top_p(logits[row], p), dim=-1)
                tokens[row] = _draw_at(probs, p.seed, len(request.output_token_ids))
        return SamplerOutput(tokens.tolist(), self._logprobs(logits, tokens, params))

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> list:
        rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        found: list[TokenLogprob | None] = [None] * len(params)
        if rows:
            index = torch.tensor(rows, device=logits.device)
            entries = gather_logprobs(logits[index], tokens[index], [params[row].logprobs for row in rows])
            for row, entry in zip(rows, entries, strict=True):
                found[row] = entry
        return found

    def check_guesses(self, logits: torch.Tensor, request: Request, guesses: list[int]) -> list[int]:
        """Speculative decoding's verification: ``logits`` has one row after each of 0..len(guesses) guesses; the
        result is the guesses kept and one more token, distributed as plain sampling would draw them (the request
        has no penalties, bias, grammar or logprobs: see spec_decode.proposers.can_speculate). A seeded request
        gets the very tokens plain sampling would: each position's token is drawn as there, and a guess is kept
        while it is that token (kept with probability p(guess), as rejection sampling keeps a certain guess)."""
        params = request.sampling_params
        if params.greedy:
            return verify_greedy(self._greedy_tokens(logits).tolist(), guesses)
        rows = logits.float() / params.temperature
        probs = torch.stack([torch.softmax(_top_k_top_p(row, params), dim=-1) for row in rows])
        if params.seed is None:
            return verify(probs, guesses, None, None)
        position, kept = len(request.output_token_ids), []
        for i, guess in enumerate(guesses):
            token = _draw_at(probs[i], params.seed, position + i)
            if token != guess:
                return [*kept, token]
            kept.append(token)
        return [*kept, _draw_at(probs[len(guesses)], params.seed, position + len(guesses))]


def _is_plain_greedy(request: Request) -> bool:
    p = request.sampling_params
    return (p.greedy and not p.has_penalties and not p.logit_bias and p.logprobs is None
            and request.constraint is None)


def _top_k_top_p(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """One row with the tokens outside top-k and top-p masked off."""
    if params.top_k > 0 and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = mask_top_p(logits, params.top_p)
    return logits


def mask_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= top_p
    drop_sorted[0] = False  # the most likely token always stays, however small top_p rounds in float32
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_penalties(logits: torch.Tensor, request: Request) -> torch.Tensor:
    """vLLM's semantics: repetition penalty over prompt and output; presence and frequency over output."""
    params = request.sampling_params
    logits = logits.clone()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(request.all_token_ids)), dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    if request.output_token_ids and (params.presence_penalty or params.frequency_penalty):
        output_ids = torch.tensor(request.output_token_ids, device=logits.device)
        # Not bincount: its output size depends on the ids' values, a sync on a GPU.
        counts = torch.zeros_like(logits).index_add_(0, output_ids, torch.ones_like(output_ids, dtype=logits.dtype))
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> None:
    """In place, on one row."""
    ids = torch.tensor(list(bias), device=logits.device)
    logits[ids] += torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)


def apply_constraints(logits: torch.Tensor, requests: list[Request]) -> None:
    """In place: each constrained row keeps only the tokens its grammar allows next. The masks are filled into
    one bitmask and applied to the batch at once. A row whose grammar allows nothing (it failed) may still end:
    its end-of-sequence tokens stay allowed."""
    rows = [row for row, request in enumerate(requests) if request.constraint is not None]
    if not rows:
        return
    vocab_size = logits.shape[1]
    # On the host: the grammar library fills it there, and only the unpacked mask moves to the logits' device.
    bitmask = torch.zeros((len(rows), (vocab_size + 31) // 32), dtype=torch.int32, device="cpu")
    for i, row in enumerate(rows):
        requests[row].constraint.fill_bitmask(bitmask[i])
    refused = refused_tokens(bitmask, vocab_size)
    for i, row in enumerate(rows):
        if refused[i].all():
            refused[i, list(requests[row].eos_token_ids)] = False
    refused = refused.to(logits.device)
    if len(rows) == len(requests):
        logits.masked_fill_(refused, float("-inf"))
    else:
        index = torch.tensor(rows, device=logits.device)
        logits[index] = logits[index].masked_fill_(refused, float("-inf"))


def refused_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 words ``[rows, words]`` to booleans ``[rows, vocab_size]``, True where the bit is clear: bit
    ``t % 32`` of word ``t // 32`` stands for token ``t``. numpy unpacks the bytes (little-endian words) several
    times faster than shifts in torch."""
    inverted = np.invert(bitmask.numpy().view(np.uint8))
    return torch.from_numpy(np.unpackbits(inverted, axis=1, bitorder="little")[:, :vocab_size].view(np.bool_))


def _draw_at(probs: torch.Tensor, seed: int | None, position: int) -> int:
    """One token from ``probs``: with the global generator when unseeded, else with one of ``seed`` and the output
    ``position`` together (splitmix64's constant spreads nearby seeds and positions apart)."""
    generator = None
    if seed is not None:
        generator = torch.Generator(device=probs.device).manual_seed((seed * 0x9E3779B97F4A7C15 + position) % 2**64)
    return int(torch.multinomial(probs, 1, generator=generator))
