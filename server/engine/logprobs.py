"""Log probabilities of chosen tokens and their top alternatives, gathered from rows of logits."""

import torch

from server.engine.request import TokenLogprob


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[TokenLogprob]:
    """For each row ``i`` of ``logits``: the logprob of ``token_ids[i]`` and the ``num_top[i]`` most likely
    tokens, under ``log_softmax(logits[i])``."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.view(-1, 1)).view(-1).tolist()
    k = max(num_top, default=0)
    top_ids: list[list[int]] = [[] for _ in num_top]
    top_values: list[list[float]] = [[] for _ in num_top]
    if k > 0:
        values, ids = torch.topk(logprobs, k, dim=-1)
        top_ids, top_values = ids.tolist(), values.tolist()
    return [
        TokenLogprob(token_id, logprob, tuple(zip(ids[:n], values[:n], strict=True)))
        for token_id, logprob, ids, values, n in zip(
            token_ids.tolist(), chosen, top_ids, top_values, num_top, strict=True
        )
    ]
