"""Turns a batch of logits into one next token per request."""

import torch

from server.engine.request import Request, SamplingParams


class Sampler:
    """Greedy, temperature, top-k, top-p, per-request seeds, and repetition/presence/frequency penalties."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        params = [r.sampling_params for r in requests]
        if all(p.greedy and not p.has_penalties for p in params):
            return logits.argmax(dim=-1).tolist()
        logits = logits.float()
        for row, request in enumerate(requests):
            if request.sampling_params.has_penalties:
                logits[row] = apply_penalties(logits[row], request)
        tokens = logits.argmax(dim=-1)
        for row, (request, p) in enumerate(zip(requests, params, strict=True)):
            if not p.greedy:
                tokens[row] = self._sample_row(logits[row], p, request.request_id)
        return tokens.tolist()

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _sample_row(self, logits: torch.Tensor, params: SamplingParams, request_id: str) -> int:
        logits = logits / params.temperature
        if params.top_k > 0 and params.top_k < logits.numel():
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if params.top_p < 1.0:
            logits = mask_top_p(logits, params.top_p)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator(params, request_id)))

    def _generator(self, params: SamplingParams, request_id: str) -> torch.Generator | None:
        if params.seed is None:
            return None
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator().manual_seed(params.seed)
            self._generators[request_id] = generator
        return generator


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
        seen = torch.tensor(sorted(set(request.all_token_ids)), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(
            values > 0, values / params.repetition_penalty, values * params.repetition_penalty
        )
    if request.output_token_ids and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(request.output_token_ids), minlength=logits.numel())
        counts = counts[: logits.numel()].to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits
