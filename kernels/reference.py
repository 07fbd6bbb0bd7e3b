"""Torch implementations of the paged kernels and of a layer's elementwise ops: the oracle of the Triton and
C++ kernels, and the path wherever those are not available.

KV cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``, in the queries' dtype or another, fp8
included (the cache is widened or narrowed to the queries' as it is read). Block tables are int32 rows of block
ids, padded with any valid block id; ``seq_lens`` counts every context token, the new ones included.

``window`` (sliding-window attention, as Mistral and Gemma 3 have it): the query at position ``p`` sees the keys at
positions ``p - window + 1`` to ``p``; None sees them all.
"""

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _gather_context(cache: torch.Tensor, block_ids: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """``[..., length, num_kv_heads, head_dim]`` of the tokens behind ``block_ids``, in ``dtype`` (the queries')."""
    gathered = cache[block_ids.long()].to(dtype)
    return gathered.reshape(*block_ids.shape[:-1], -1, *cache.shape[2:])[..., :length, :, :]


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """One query token per sequence. ``q``: ``[num_seqs, num_heads, head_dim]``; returns the same shape.

    ``max_seq_len``, the longest of ``seq_lens``, spares reading it back from the device."""
    max_len = max_seq_len if max_seq_len is not None else int(seq_lens.max())
    num_blocks = -(-max_len // k_cache.shape[1])
    tables = block_tables[:, :num_blocks]
    keys = _gather_context(k_cache, tables, max_len, q.dtype).transpose(1, 2)
    values = _gather_context(v_cache, tables, max_len, q.dtype).transpose(1, 2)
    positions = torch.arange(max_len, device=q.device)[None, :]
    lens = seq_lens[:, None].to(q.device)
    mask = positions < lens
    if window is not None:
        mask &= positions >= lens - window
    mask = mask[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.squeeze(2)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    query_starts: Sequence[int] | None = None,
    context_lens: Sequence[int] | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    ``q``: ``[num_tokens, num_heads, head_dim]``, sequence ``i`` owning rows
    ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]``, which are the last tokens of its ``seq_lens[i]`` context tokens.
    ``query_starts`` and ``context_lens``, host copies of ``cu_seqlens_q`` and ``seq_lens``, spare reading them
    back from the device.
    """
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts = query_starts if query_starts is not None else cu_seqlens_q.tolist()
    lengths = context_lens if context_lens is not None else seq_lens.tolist()
    for i, context_len in enumerate(lengths):
        start, end = starts[i], starts[i + 1]
        num_new = end - start
        if num_new == 0:
            continue
        blocks = block_tables[i, : -(-context_len // block_size)]
        keys = _gather_context(k_cache, blocks, context_len, q.dtype).transpose(0, 1)
        values = _gather_context(v_cache, blocks, context_len, q.dtype).transpose(0, 1)
        queries = q[start:end].transpose(0, 1)
        if num_new == context_len and window is None:
            attended = F.scaled_dot_product_attention(
                queries, keys, values, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            query_pos = torch.arange(context_len - num_new, context_len, device=q.device)
            key_pos = torch.arange(context_len, device=q.device)[None, :]
            mask = key_pos <= query_pos[:, None]
            if window is not None:
                mask &= key_pos > query_pos[:, None] - window
            attended = F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
        out[start:end] = attended.transpose(0, 1)
    return out


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` (``[num_tokens, num_kv_heads, head_dim]``) into their slots; slot -1 is skipped.

    Without reading a value back to the host (no sync on a GPU): a skipped row writes slot 0 with what slot 0
    holds after the call anyway, its own value or the one a valid row writes there."""
    if slot_mapping.numel() == 0:
        return
    slots = slot_mapping.long()
    valid = slots >= 0
    destinations = torch.where(valid, slots, 0)
    writes_zero = valid & (slots == 0)
    first_zero_writer = writes_zero.int().argmax(dim=0, keepdim=True)
    for new, cache in ((k, k_cache), (v, v_cache)):
        # As bits: index_copy_ has no fp8 kernels.
        bits = _BITS[cache.element_size()]
        flat = cache.view(-1, *cache.shape[2:]).view(bits)
        new = new.to(cache.dtype).view(bits)
        slot_zero = torch.where(writes_zero.any(), new[first_zero_writer][0], flat[0])
        flat.index_copy_(0, destinations, torch.where(valid[:, None, None], new, slot_zero))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As Hugging Face computes it: normalise in fp32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm: ``(hidden + delta, rms_norm(hidden + delta))``."""
    hidden = hidden + delta
    return hidden, rms_norm(hidden, weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate-half RoPE of ``[tokens, heads, head_dim]`` q and k, from fp32 ``[positions, head_dim]`` tables."""
    cos = cos[positions].to(q.dtype)[:, None, :]
    sin = sin[positions].to(q.dtype)[:, None, :]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first highest logit, as argmax gives it: on the CPU ``max`` finds it 4x faster (bf16 logits,
    49152 of them: 44 against 181 us a row)."""
    return logits.max(dim=-1).indices


def dequantize_int8(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 ``[N, K]`` codes times fp32 ``[N, groups]`` scales, as fp32."""
    return w.float() * scales.repeat_interleave(w.shape[1] // scales.shape[1], dim=1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """uint8 ``[N, K / 2]`` in Q4_1's block layout (byte i of 32 features: feature i low, feature i + 16 high),
    each code times its group's scale plus its group's min (fp16 ``[N, groups]`` both), as fp32."""
    n = packed.shape[0]
    blocks = packed.reshape(n, -1, 16)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=2).reshape(n, -1).float()
    group = codes.shape[1] // scales.shape[1]
    return codes * scales.float().repeat_interleave(group, dim=1) + mins.float().repeat_interleave(group, dim=1)


def int8_linear(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x · Wᵀ`` for int8 W with group scales, in fp32, returned in x's dtype."""
    return F.linear(x.float(), dequantize_int8(w, scales)).to(x.dtype)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """``x · Wᵀ`` for packed int4 W with group scales and minimums, in fp32, returned in x's dtype."""
    return F.linear(x.float(), dequantize_int4(packed, scales, mins)).to(x.dtype)
