"""Causal attention of prompts that have no cached context, from their own keys and values.

Such a prefill needs nothing from the paged cache, so torch's flash attention can take it: on a bf16 CPU with AMX
its tiles go through oneDNN's matrix products, 2.2-3.4x faster than the C++ paged kernel on SmolLM2's and Gemma 3's
heads for 128-512 new tokens (docs/performance-history.md). Without AMX the paged kernel is the faster, and the CPU
backend keeps this path off (``CpuAttention.fresh_by_flash``).
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def fresh_sequences(query_starts: Sequence[int], context_lens: Sequence[int], window: int | None) -> list[bool]:
    """Per prefill sequence: its new tokens are its whole context, and a sliding window, if any, covers them."""
    lengths = [end - start for start, end in zip(query_starts, query_starts[1:], strict=False)]
    return [
        length == context and (window is None or length <= window)
        for length, context in zip(lengths, context_lens, strict=True)
    ]


def _equal_length_runs(query_starts: Sequence[int], chosen: Sequence[bool]) -> list[tuple[int, int, int]]:
    """(first row, sequences, new tokens each) of every run of consecutive chosen sequences with one number of new
    tokens."""
    runs: list[tuple[int, int, int]] = []
    extends = False
    for start, end, taken in zip(query_starts, query_starts[1:], chosen, strict=False):
        if taken and extends and runs[-1][2] == end - start:
            first, count, length = runs[-1]
            runs[-1] = (first, count + 1, length)
        elif taken:
            runs.append((start, 1, end - start))
        extends = taken
    return runs


def attend_fresh(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    query_starts: Sequence[int],
    chosen: Sequence[bool],
    scale: float,
    out: torch.Tensor,
) -> None:
    """Writes the chosen sequences' rows of ``out``. ``q``: ``[tokens, heads, head_dim]``, ``k``/``v``:
    ``[tokens, kv_heads, head_dim]``, sequence ``i`` owning rows ``query_starts[i]:query_starts[i + 1]``;
    consecutive sequences of one length go in one call."""
    for first, count, length in _equal_length_runs(query_starts, chosen):
        rows = slice(first, first + count * length)
        if not length:
            continue
        q_run, k_run, v_run = (x[rows].view(count, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        attended = F.scaled_dot_product_attention(q_run, k_run, v_run, is_causal=True, scale=scale, enable_gqa=True)
        out[rows] = attended.transpose(1, 2).reshape(count * length, *q.shape[1:])
