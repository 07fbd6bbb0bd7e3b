"""Turns a batch of logits into next tokens, with their logprobs where asked: every row's token is found by tensor
ops over the whole batch, and one transfer brings the tokens (and logprobs) to the host."""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from server.engine.logprobs import logprob_entries, top_logprobs
from server.engine.request import Request, SamplingParams, TokenLogprob
from server.engine.spec_decode.rejection import verify_greedy


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprob | None]  # per row; None where the request did not ask


@dataclass
class StepTokens:
    """Per request: the tokens to append (one, or with guesses the guesses kept and one more) and the logprobs of
    its token (None unless asked; a request with guesses never asks)."""

    appended: list[list[int]]
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Greedy, temperature, top-k, top-p, per-request seeds, repetition/presence/frequency penalties, logit bias
    and structured-output masks, in one batch, and speculative guesses verified in the same batch.

    Logprobs come from the distribution the token is drawn from, before top-k and top-p: the logits after
    penalties, logit bias and the structured-output mask, divided by the temperature (greedy rows: by 1).

    A sampled row draws by inverse transform, with one uniform draw a row. A seeded request's draw at each output
    position is a hash of its seed and that position alone, so its token depends on nothing else: not on the other
    rows, nor on the steps before, nor on whether speculation verified it.

    Guesses (certain proposals, as n-gram lookup makes) are verified by drawing every position as plain sampling
    would and keeping each guess while it is the token drawn: a guess is kept with probability ``p(guess)`` and
    the first other token is drawn from ``p`` without the guess, which is rejection sampling of a certain proposal
    (spec_decode/rejection.py), and a seeded request gets the very tokens plain sampling gives.
    """

    def __init__(self, greedy_tokens: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """``greedy_tokens``: each row's first highest logit (the layer ops' kernel)."""
        self._greedy_tokens = greedy_tokens

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        """One row and one token per request."""
        step = self.sample_step(logits, requests, [[] for _ in requests])
        return SamplerOutput([tokens[0] for tokens in step.appended], step.logprobs)

    def check_guesses(self, logits: torch.Tensor, requests: list[Request], guesses: list[list[int]]) -> list[list[int]]:
        """Speculative decoding's verification, for several requests at once: each request has one row after each
        of 0..len(its guesses) guesses; the result is, per request, the guesses kept and one more token."""
        return self.sample_step(logits, requests, guesses).appended

    def sample_step(self, logits: torch.Tensor, requests: list[Request], guesses: list[list[int]]) -> StepTokens:
        """``logits`` holds, request after request, one row after each of 0..len(guesses[i]) guesses. A request
        with guesses has no penalties, bias, grammar or logprobs (spec_decode.proposers.can_speculate)."""
        offsets = [offset for tried in guesses for offset in range(len(tried) + 1)]
        rows = [request for request, tried in zip(requests, guesses, strict=True) for _ in range(len(tried) + 1)]
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(rows)} rows of requests and guesses")
        if all(_is_plain_greedy(request) for request in requests):
            drawn, logprobs = self._to_host(self._greedy_tokens(logits)), [None] * len(requests)
        else:
            tokens, asked, found = self.draw(logits, rows, offsets)
            drawn, logprobs = self._unpack(tokens, asked, found, requests, offsets)
        appended, first = [], 0
        for tried in guesses:
            appended.append(verify_greedy(drawn[first : first + len(tried) + 1], tried))
            first += len(tried) + 1
        return StepTokens(appended, logprobs)

    def draw(
        self, logits: torch.Tensor, rows: list[Request], offsets: list[int]
    ) -> tuple[torch.Tensor, list[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
        """On the logits' device, nothing read back: each row's token (row ``i`` samples ``rows[i]``'s output
        position ``len(output) + offsets[i]``), the rows that asked for logprobs, and their chosen logprobs, top
        logprobs and top ids."""
        params = [request.sampling_params for request in rows]
        logits = apply_logit_bias(apply_penalties(logits.float(), rows), params)
        apply_constraints(logits, rows)
        sampled = [row for row, p in enumerate(params) if not p.greedy]
        if sampled:
            temperatures = [1.0 if p.greedy else p.temperature for p in params]
            logits = logits / _column(temperatures, logits)
        positions = [len(request.output_token_ids) + offset for request, offset in zip(rows, offsets, strict=True)]
        if len(sampled) == len(rows):
            tokens = self._random_tokens(logits, params, positions)
        else:
            tokens = self._greedy_tokens(logits)
            if sampled:
                index = _index(sampled, logits.device)
                tokens[index] = self._random_tokens(
                    logits[index], [params[row] for row in sampled], [positions[row] for row in sampled])
        asked = [row for row, p in enumerate(params) if p.logprobs is not None]
        if not asked:
            return tokens, asked, None
        index = _index(asked, logits.device)
        return tokens, asked, top_logprobs(logits[index], tokens[index], max(params[row].logprobs for row in asked))

    def _random_tokens(self, logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> torch.Tensor:
        """Each row's token by inverse transform: the first whose cumulative probability passes the row's uniform
        draw, one draw a row (zero-probability tokens are never passed into)."""
        probs = torch.softmax(mask_top_k_top_p(logits, [p.top_k for p in params], [p.top_p for p in params]), dim=-1)
        cumulative = probs.cumsum(dim=-1)
        total = cumulative[:, -1:]
        uniforms = _column(self.uniforms(params, positions), cumulative)
        # Below the total, whatever the product rounds to: the search ends inside the row (a row of NaNs, which an
        # overflowing temperature could make, still gives a token id).
        target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
        return torch.searchsorted(cumulative, target, right=True).view(-1).clamp_(max=logits.shape[-1] - 1)

    @staticmethod
    def uniforms(params: list[SamplingParams], positions: list[int]) -> list[float]:
        """One uniform draw in [0, 1) a row, on the host (they go to the device with the rows' other settings): a
        seeded row's is a hash of its seed and output position alone; unseeded rows take theirs from torch's
        global generator, which ``LLM(seed=...)`` seeds."""
        unseeded = sum(p.seed is None for p in params)
        drawn = iter(torch.rand(unseeded, dtype=torch.float64, device="cpu").tolist() if unseeded else [])
        return [next(drawn) if p.seed is None else seeded_uniform(p.seed, position)
                for p, position in zip(params, positions, strict=True)]

    @staticmethod
    def _to_host(values: torch.Tensor) -> list:
        """The step's one device-to-host transfer."""
        return values.tolist()

    def _unpack(
        self, tokens: torch.Tensor, asked: list[int], found: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
        requests: list[Request], offsets: list[int],
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """Tokens and logprobs in one float64 tensor (exact for float32 values and token ids), read back at once."""
        logprobs: list[TokenLogprob | None] = [None] * len(requests)
        if found is None:
            return self._to_host(tokens), logprobs
        rows, k = len(tokens), found[1].shape[1]
        values = self._to_host(torch.cat([part.reshape(-1).to(torch.float64) for part in (tokens, *found)]))
        drawn = [int(token) for token in values[:rows]]
        chosen, values = values[rows : rows + len(asked)], values[rows + len(asked) :]
        top_values, top_ids = values[: k * len(asked)], [int(t) for t in values[k * len(asked) :]]
        owners = _row_to_request(offsets)
        entries = logprob_entries(
            [drawn[row] for row in asked], chosen,
            [top_ids[i * k : (i + 1) * k] for i in range(len(asked))],
            [top_values[i * k : (i + 1) * k] for i in range(len(asked))],
            [requests[owners[row]].sampling_params.logprobs for row in asked],
        )
        for row, entry in zip(asked, entries, strict=True):
            logprobs[owners[row]] = entry
        return drawn, logprobs


def _is_plain_greedy(request: Request) -> bool:
    p = request.sampling_params
    return (p.greedy and not p.has_penalties and not p.logit_bias and p.logprobs is None
            and request.constraint is None)


def _row_to_request(offsets: list[int]) -> list[int]:
    """Each row's request: a request's rows start at offset 0."""
    owners, request = [], -1
    for offset in offsets:
        request += offset == 0
        owners.append(request)
    return owners


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, 1)


def mask_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Each row with the tokens outside its top-k and top-p masked off (``top_k`` below 1, or the vocabulary or
    more, and ``top_p`` 1 keep every token). Top-p keeps the smallest set of most likely tokens, among those top-k
    keeps, whose probability reaches ``top_p``; tokens tied with the k-th stay."""
    vocab = logits.shape[-1]
    top_k = [k if 0 < k < vocab else vocab for k in top_k]
    if all(k == vocab for k in top_k) and all(p >= 1.0 for p in top_p):
        return logits
    if all(p >= 1.0 for p in top_p):  # top-k alone: topk finds the k-th values faster than a sort
        values = torch.topk(logits, max(top_k), dim=-1).values
        kth = values.gather(1, _index([k - 1 for k in top_k], logits.device).view(-1, 1))
        return logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    kth = sorted_logits.gather(1, _index([k - 1 for k in top_k], logits.device).view(-1, 1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    drop = probs.cumsum(dim=-1) - probs >= _column(top_p, probs)
    drop[:, 0] = False  # the most likely token always stays, however small top_p rounds in float32
    drop &= _column(top_p, probs) < 1.0  # a sum that rounds past 1 must not cut a row that keeps every token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """vLLM's semantics: repetition penalty over prompt and output; presence and frequency over output. Row ``i``
    is ``requests[i]``'s. Out of place; the tokens each row penalises are listed on the host, and every row's
    penalties are applied at once."""
    seen_rows: list[int] = []
    seen_ids: list[int] = []
    repetition: list[float] = []
    counted_rows: list[int] = []
    counted_ids: list[int] = []
    subtracted: list[float] = []
    for row, request in enumerate(requests):
        params = request.sampling_params
        if params.repetition_penalty != 1.0:
            seen = sorted(set(request.all_token_ids))
            seen_rows += [row] * len(seen)
            seen_ids += seen
            repetition += [params.repetition_penalty] * len(seen)
        if params.presence_penalty or params.frequency_penalty:
            for token, count in Counter(request.output_token_ids).items():
                counted_rows.append(row)
                counted_ids.append(token)
                subtracted.append(params.frequency_penalty * count + params.presence_penalty)
    if not seen_rows and not counted_rows:
        return logits
    logits, device = logits.clone(), logits.device
    if seen_rows:
        index = (_index(seen_rows, device), _index(seen_ids, device))
        values, penalty = logits[index], torch.tensor(repetition, dtype=logits.dtype, device=device)
        logits[index] = torch.where(values > 0, values / penalty, values * penalty)
    if counted_rows:
        index = (_index(counted_rows, device), _index(counted_ids, device))
        logits.index_put_(index, -torch.tensor(subtracted, dtype=logits.dtype, device=device), accumulate=True)
    return logits


def apply_logit_bias(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """In place: every row's bias added at once."""
    rows = [row for row, p in enumerate(params) if p.logit_bias for _ in p.logit_bias]
    if rows:
        ids = [token for p in params if p.logit_bias for token in p.logit_bias]
        bias = [value for p in params if p.logit_bias for value in p.logit_bias.values()]
        device = logits.device
        logits.index_put_((_index(rows, device), _index(ids, device)),
                          torch.tensor(bias, dtype=logits.dtype, device=device), accumulate=True)
    return logits


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
    for i in np.flatnonzero(refused.numpy().all(axis=1)):
        refused[i, list(requests[rows[i]].eos_token_ids)] = False
    refused = refused.to(logits.device)
    if len(rows) == len(requests):
        logits.masked_fill_(refused, float("-inf"))
    else:
        index = _index(rows, logits.device)
        logits[index] = logits[index].masked_fill_(refused, float("-inf"))


def seeded_uniform(seed: int, position: int) -> float:
    """A uniform draw in [0, 1) that is a function of ``seed`` and the output ``position`` alone: splitmix64's
    finaliser over the two (its constant spreads nearby seeds and positions apart), 24 bits, exact in float32."""
    mask = 2**64 - 1
    z = (seed * 0x9E3779B97F4A7C15 + position) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return ((z ^ (z >> 31)) >> 40) / 2**24


def refused_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 words ``[rows, words]`` to booleans ``[rows, vocab_size]``, True where the bit is clear: bit
    ``t % 32`` of word ``t // 32`` stands for token ``t``. numpy unpacks the bytes (little-endian words) several
    times faster than shifts in torch."""
    inverted = np.invert(bitmask.numpy().view(np.uint8))
    return torch.from_numpy(np.unpackbits(inverted, axis=1, bitorder="little")[:, :vocab_size].view(np.bool_))
