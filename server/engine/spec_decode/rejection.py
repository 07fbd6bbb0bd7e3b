"""Rejection sampling of proposed tokens against the target model's distributions (Leviathan et al., 2023; Chen
et al., 2023): the tokens it keeps are distributed exactly as if the target had sampled them one by one.

A proposal token t drawn with probability q(t) is kept with probability min(1, p(t) / q(t)), where p is the
target's distribution at that position. At the first rejection, the replacement is drawn from the residual
max(0, p - q), normalised, and the rest of the proposal is dropped. If every proposal is kept, one more token is
drawn from the target's distribution after the last one. An n-gram guess is a certain proposal: q is 1 at the
guessed token, so it is kept with probability p(t) and the residual is p without t.
"""

import torch


def verify(
    target_probs: torch.Tensor,
    draft_ids: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """The tokens to append: the kept prefix of ``draft_ids`` and one more (a replacement or a bonus).

    ``target_probs`` is ``[len(draft_ids) + 1, vocab]``: row i is the target's distribution for the token after
    i drafts. ``draft_probs`` (``[len(draft_ids), vocab]``) is the proposer's, or None for certain proposals.
    """
    device = target_probs.device
    kept: list[int] = []
    for i, token in enumerate(draft_ids):
        p = target_probs[i]
        q = draft_probs[i][token] if draft_probs is not None else torch.ones((), device=device)
        accept = torch.clamp(p[token] / q, max=1.0)
        if float(torch.rand((), generator=generator, device=device)) < float(accept):
            kept.append(token)
            continue
        residual = p.clone() if draft_probs is None else torch.clamp(p - draft_probs[i], min=0.0)
        if draft_probs is None:
            residual[token] = 0.0
        return [*kept, _draw(residual, generator)]
    return [*kept, _draw(target_probs[len(draft_ids)], generator)]


def verify_greedy(target_argmax: list[int], draft_ids: list[int]) -> list[int]:
    """At temperature 0: keep the drafts the target would have chosen itself, then the target's own next token."""
    kept = 0
    while kept < len(draft_ids) and draft_ids[kept] == target_argmax[kept]:
        kept += 1
    return [*draft_ids[:kept], target_argmax[kept]]


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    total = weights.sum()
    if float(total) <= 0.0:  # p equals q: any token of p is as good; the argmax keeps it deterministic
        return int(weights.argmax())
    return int(torch.multinomial(weights / total, 1, generator=generator))
