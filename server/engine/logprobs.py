"""Log probabilities of chosen tokens and their top alternatives, gathered from rows of logits."""

import torch

from server.engine.request import TokenLogprob


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[TokenLogprob]:
    """For each row ``i`` of ``logits``: the logprob of ``token_ids[i]`` and the ``num_top[i]`` most likely
    tokens, under ``log_softmax(logits[i])``."""
    chosen, top_values, top_ids = top_logprobs(logits, token_ids, max(num_top, default=0))
    return logprob_entries(token_ids.tolist(), chosen.tolist(), top_ids.tolist(), top_values.tolist(), num_top)


def top_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """On the logits' device: each row's logprob of its token ``[rows]``, and its ``k`` highest logprobs and their
    ids ``[rows, k]``, under ``log_softmax`` of the row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, token_ids.view(-1, 1)).view(-1)
    values, ids = torch.topk(logprobs, k, dim=-1)
    return chosen, values, ids


def logprob_entries(
    token_ids: list[int], chosen: list[float], top_ids: list[list[int]], top_values: list[list[float]],
    num_top: list[int],
) -> list[TokenLogprob]:
    """The host values of ``top_logprobs`` as entries, row ``i`` keeping its ``num_top[i]`` top tokens."""
    return [
        TokenLogprob(token_id, logprob, tuple(zip(ids[:n], values[:n], strict=True)))
        for token_id, logprob, ids, values, n in zip(token_ids, chosen, top_ids, top_values, num_top, strict=True)
    ]
