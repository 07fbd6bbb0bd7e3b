"""Causal attention of prompts that have no cached context, from their own keys and values.

Such a prefill needs nothing from the paged cache, so torch's flash attention can take it: on a bf16 CPU with AMX
its tiles go through oneDNN's matrix products, 2.2-3.4x faster than the C++ paged kernel on SmolLM2's and Gemma 3's
heads for 128-512 new tokens (docs/performance.md).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def applies(query_starts: Sequence[int], context_lens: Sequence[int], window: int | None) -> bool:
    """Every sequence's new tokens are its whole context, and a sliding window, if any, covers them all."""
    lengths = [end - start for start, end in zip(query_starts, query_starts[1:], strict=False)]
    fresh = all(length == context for length, context in zip(lengths, context_lens, strict=True))
    return fresh and (window is None or max(lengths, default=0) <= window)


def _equal_length_runs(query_starts: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first row, sequences, new tokens each) of every run of consecutive sequences with one number of new
    tokens."""
    runs: list[tuple[int, int, int]] = []
    for start, end in zip(query_starts, query_starts[1:], strict=False):
        if runs and runs[-1][2] == end - start:
            first, count, length = runs[-1]
            runs[-1] = (first, count + 1, length)
        else:
            runs.append((start, 1, end - start))
    return runs


def fresh_prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_starts: Sequence[int], scale: float
) -> torch.Tensor:
    """``q``: ``[tokens, heads, head_dim]``, ``k``/``v``: ``[tokens, kv_heads, head_dim]``, sequence ``i`` owning
    rows ``query_starts[i]:query_starts[i + 1]``; consecutive sequences of one length go in one call."""
    out = torch.empty_like(q)
    for first, count, length in _equal_length_runs(query_starts):
        rows = slice(first, first + count * length)
        if not length:
            continue
        q_run, k_run, v_run = (x[rows].view(count, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        attended = F.scaled_dot_product_attention(q_run, k_run, v_run, is_causal=True, scale=scale, enable_gqa=True)
        out[rows] = attended.transpose(1, 2).reshape(count * length, *q.shape[1:])
    return out
