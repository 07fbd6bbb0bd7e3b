"""Triton paged attention over a ``[num_blocks, block_size, num_kv_heads, head_dim]`` KV cache.

Decode splits each sequence's context into partitions (flash-decoding): one program per
(sequence, KV head, partition) computes a partial softmax for all the query heads sharing that KV
head, and a second kernel merges the partitions by their log-sum-exp. Prefill runs causal flash
attention for each sequence's new tokens over its whole paged context.

Both kernels accumulate in fp32 and keep scores in base 2 (``exp2``), with ``scale * log2(e)``
folded into the scores. ``window`` (sliding-window attention) limits each query to the ``window`` keys up to its own
position; the kernels skip the tiles before them.
"""

import functools
import math
import os

import torch
import triton
import triton.language as tl

# The interpreter mishandles low-precision tl.dot and cannot benchmark several autotune configs.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

MIN_PARTITION = 32
MAX_PARTITION = 512
_MERGE_SPLIT_TILE = 16
_MAX_GROUP = 16


def _decode_configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1)]
    shapes = ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3))
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for n, w, s in shapes]


def _prefill_configs() -> list[triton.Config]:
    if _INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4, num_stages=1)]
    shapes = ((64, 64, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3))
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


def _tiles_fit_partition(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Drop tiles wider than a partition: they would be correct, but mostly masked off."""
    partition = kwargs.get("PARTITION", named_args.get("PARTITION"))
    return [c for c in configs if c.kwargs["BLOCK_N"] <= partition]


# DOT_FP32 (fp32 caches, and every dtype under the interpreter) multiplies in fp32 as tf32x3: near-fp32
# accuracy on the tensor cores, where "ieee" spilled heavily on sm_90.
@triton.jit
def _qk_scores(q, k, DOT_FP32: tl.constexpr):
    """``q @ k.T`` in fp32: ``q`` is ``[M, HEAD_DIM]``, ``k`` is ``[N, HEAD_DIM]``."""
    if DOT_FP32:
        return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="tf32x3")
    return tl.dot(q.to(k.dtype), tl.trans(k))


@triton.jit
def _pv(p, v, DOT_FP32: tl.constexpr):
    """``p @ v`` in fp32 for fp32 probabilities ``p`` ``[M, N]`` and values ``v`` ``[N, HEAD_DIM]``."""
    if DOT_FP32:
        return tl.dot(p, v.to(tl.float32), input_precision="tf32x3")
    return tl.dot(p.to(v.dtype), v)


@triton.jit
def _token_offsets(
    block_table_row, tokens, valid, kv_head,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """Element offsets (int64) of ``tokens``' rows for ``kv_head`` in a contiguous paged cache."""
    blocks = tl.load(block_table_row + tokens // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slots = blocks * BLOCK_SIZE + tokens % BLOCK_SIZE
    return slots * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM


@triton.autotune(
    configs=_decode_configs(),
    key=["PARTITION", "BLOCK_SIZE", "HEAD_DIM", "GROUP_PAD"],
    prune_configs_by={"early_config_prune": _tiles_fit_partition},
)
@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, o_ptr, lse_ptr,
    scale_log2e,
    stride_qs, stride_qh, stride_bt, stride_os, stride_oh, stride_osplit, stride_ls, stride_lh,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, PARTITION: tl.constexpr,
    STORE_LSE: tl.constexpr, DOT_FP32: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Attention of one sequence's query heads sharing one KV head over one partition of its context.

    Writes the normalized partial output (``o_ptr``; the final output when there is one partition) and,
    with STORE_LSE, the partition's base-2 log-sum-exp. Partitions past the context write nothing; a partition
    wholly before the window writes zeros and a log-sum-exp of -inf, which the merge weighs as nothing.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    split_start = split * PARTITION
    if split_start >= seq_len:
        return
    split_end = tl.minimum(split_start + PARTITION, seq_len)
    if WINDOW > 0:
        split_start = tl.maximum(split_start, seq_len - WINDOW)

    group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group
    head_ok = group < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :], mask=head_ok[:, None], other=0.0
    )

    block_table_row = block_tables_ptr + seq * stride_bt
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for start in range(split_start, split_end, BLOCK_N):
        tokens = start + tl.arange(0, BLOCK_N)
        valid = tokens < split_end
        rows = _token_offsets(block_table_row, tokens, valid, kv_head, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        k = tl.load(k_cache_ptr + rows[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        scores = _qk_scores(q, k, DOT_FP32) * scale_log2e
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + rows[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + _pv(p, v, DOT_FP32)
        m_i = m_new

    if WINDOW > 0:
        # A partition wholly before the window saw no key: zeros, and a log-sum-exp of -inf (m_i stays -inf).
        l_i = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_i[:, None]
    o_rows = o_ptr + seq * stride_os + heads * stride_oh + split * stride_osplit
    tl.store(o_rows[:, None] + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=head_ok[:, None])
    if STORE_LSE:
        lse_rows = lse_ptr + seq * stride_ls + heads * stride_lh + split
        tl.store(lse_rows, m_i + tl.log2(l_i), mask=head_ok)


@triton.jit
def _decode_merge_kernel(
    partial_ptr, lse_ptr, seq_lens_ptr, out_ptr,
    stride_ps, stride_ph, stride_psplit, stride_ls, stride_lh, stride_os, stride_oh,
    PARTITION: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT_TILE: tl.constexpr,
):
    """Combine one (sequence, head)'s partition outputs, weighting each by its share of the softmax mass."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_splits = tl.cdiv(tl.load(seq_lens_ptr + seq), PARTITION)
    lse_row = lse_ptr + seq * stride_ls + head * stride_lh
    partial_row = partial_ptr + seq * stride_ps + head * stride_ph
    dims = tl.arange(0, HEAD_DIM)

    lse_max = tl.full([SPLIT_TILE], float("-inf"), tl.float32)
    for first in range(0, num_splits, SPLIT_TILE):
        splits = first + tl.arange(0, SPLIT_TILE)
        lse = tl.load(lse_row + splits, mask=splits < num_splits, other=float("-inf"))
        lse_max = tl.maximum(lse_max, lse)
    global_max = tl.max(lse_max, 0)

    weight_sum = tl.zeros([SPLIT_TILE], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for first in range(0, num_splits, SPLIT_TILE):
        splits = first + tl.arange(0, SPLIT_TILE)
        in_range = splits < num_splits
        weight = tl.exp2(tl.load(lse_row + splits, mask=in_range, other=float("-inf")) - global_max)
        part = tl.load(
            partial_row + splits[:, None] * stride_psplit + dims[None, :], mask=in_range[:, None], other=0.0
        )
        weight_sum += weight
        acc += tl.sum(weight[:, None] * part, 0)

    out = acc / tl.sum(weight_sum, 0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))


@triton.autotune(
    configs=_prefill_configs(),
    key=["BLOCK_SIZE", "HEAD_DIM", "GROUP_PAD"],
)
@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, o_ptr, block_tables_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
    scale_log2e,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DOT_FP32: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Causal attention of a tile of one sequence's new tokens, for every query head of one KV head.

    The tile's BLOCK_M rows are (token, head in group) pairs, token-major, so every K/V tile loaded
    serves the whole group.
    """
    TILE_TOKENS: tl.constexpr = BLOCK_M // GROUP_PAD
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    first_token = tile * TILE_TOKENS
    if first_token >= q_len:
        return
    context_len = tl.load(seq_lens_ptr + seq)
    prefix_len = context_len - q_len

    rows = tl.arange(0, BLOCK_M)
    tokens = first_token + rows // GROUP_PAD
    group = rows % GROUP_PAD
    row_ok = (tokens < q_len) & (group < GROUP)
    heads = kv_head * GROUP + group
    query_pos = prefix_len + tokens
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + (q_start + tokens)[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )

    block_table_row = block_tables_ptr + seq * stride_bt
    kv_end = tl.minimum(context_len, prefix_len + first_token + TILE_TOKENS)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Without a window, key 0 is visible to every row, so no row's running max stays -inf after the first tile.
    # With one, a row may see nothing in the first tiles: its exponents are then taken from 0, so that they are 0.
    kv_start = 0
    if WINDOW > 0:
        kv_start = tl.maximum(0, prefix_len + first_token - WINDOW + 1) // BLOCK_N * BLOCK_N
    for start in range(kv_start, kv_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        valid = keys < kv_end
        kv_rows = _token_offsets(block_table_row, keys, valid, kv_head, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        k = tl.load(k_cache_ptr + kv_rows[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        scores = _qk_scores(q, k, DOT_FP32) * scale_log2e
        visible = valid[None, :] & (keys[None, :] <= query_pos[:, None])
        if WINDOW > 0:
            visible = visible & (keys[None, :] > query_pos[:, None] - WINDOW)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_exp = m_new
        if WINDOW > 0:
            m_exp = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_exp)
        p = tl.exp2(scores - m_exp[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + dims[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + _pv(p, v, DOT_FP32)
        m_i = m_new

    out = acc / l_i[:, None]
    o_rows = o_ptr + (q_start + tokens) * stride_ot + heads * stride_oh
    tl.store(o_rows[:, None] + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_partition_size(context_capacity: int, programs_per_split: int, num_sms: int) -> int:
    """Tokens per decode partition: small enough to give every SM about two programs, within bounds."""
    wanted_splits = triton.cdiv(2 * num_sms, programs_per_split)
    partition = triton.next_power_of_2(triton.cdiv(context_capacity, wanted_splits))
    return min(MAX_PARTITION, max(MIN_PARTITION, partition))


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
    """``(group, group_pad)`` for these shapes, after checking what the kernels assume of them."""
    num_heads, head_dim = q.shape[-2:]
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if v_cache.shape != k_cache.shape or cache_head_dim != head_dim:
        raise ValueError(f"mismatched shapes: q {tuple(q.shape)}, caches {tuple(k_cache.shape)}, "
                         f"{tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous")
    if q.stride(-1) != 1:
        raise ValueError("q's last dimension must be contiguous")
    for name, size in (("head_dim", head_dim), ("block_size", block_size)):
        if size & (size - 1):
            raise ValueError(f"{name} must be a power of two, got {size}")
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} KV heads evenly")
    group = num_heads // num_kv_heads
    if group > _MAX_GROUP:
        raise ValueError(f"at most {_MAX_GROUP} query heads per KV head, got {group}")
    return group, triton.next_power_of_2(group)


def _output_for(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q)
    if out.shape != q.shape or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(f"out must be shaped like q {tuple(q.shape)} with a contiguous last dimension")
    return out


def _dot_in_fp32(cache: torch.Tensor) -> bool:
    return _INTERPRET or cache.dtype == torch.float32


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    partition_size: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """One query token per sequence. ``q``: ``[num_seqs, num_heads, head_dim]``; returns the same shape.

    Every ``seq_lens`` entry must be at least 1. Results go to ``out`` when given. ``partition_size``
    (a power of two, at least MIN_PARTITION) overrides the tokens per split; by default it is picked
    from the block table's width, so no host sync is needed.
    """
    group, group_pad = _check_shapes(q, k_cache, v_cache)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = _output_for(q, out)
    if num_seqs == 0:
        return out
    capacity = block_tables.shape[1] * block_size
    partition = partition_size or decode_partition_size(capacity, num_seqs * num_kv_heads, _num_sms(q.device))
    if partition < MIN_PARTITION or partition & (partition - 1):
        raise ValueError(f"partition_size must be a power of two >= {MIN_PARTITION}, got {partition}")
    num_splits = triton.cdiv(capacity, partition)

    if num_splits == 1:
        partial, lse = out, out
        partial_strides = (out.stride(0), out.stride(1), 0)
    else:
        partial = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        partial_strides = partial.stride()[:3]
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, partial, lse,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), block_tables.stride(0), *partial_strides, lse.stride(0), lse.stride(1),
        BLOCK_SIZE=block_size, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        GROUP=group, GROUP_PAD=max(16, group_pad), PARTITION=partition,
        STORE_LSE=num_splits > 1, DOT_FP32=_dot_in_fp32(k_cache), WINDOW=window or 0,
    )
    if num_splits > 1:
        _decode_merge_kernel[(num_seqs, num_heads)](
            partial, lse, seq_lens, out,
            *partial_strides, lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
            PARTITION=partition, HEAD_DIM=head_dim, SPLIT_TILE=_MERGE_SPLIT_TILE,
        )
    return out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its whole paged context.

    ``q``: ``[num_tokens, num_heads, head_dim]``, sequence ``i`` owning rows
    ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]``, which are the last tokens of its ``seq_lens[i]`` context
    tokens. Results go to ``out`` when given. ``max_query_len``, the longest of those row ranges, spares
    reading it back from the device.
    """
    group, group_pad = _check_shapes(q, k_cache, v_cache)
    num_tokens, _, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = _output_for(q, out)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    max_q_len = max_query_len if max_query_len is not None else int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())

    def grid(meta: dict) -> tuple[int, int, int]:
        return (triton.cdiv(max_q_len, meta["BLOCK_M"] // group_pad), num_kv_heads, num_seqs)

    _prefill_kernel[grid](
        q, k_cache, v_cache, out, block_tables, cu_seqlens_q, seq_lens,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        BLOCK_SIZE=block_size, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        GROUP=group, GROUP_PAD=group_pad, DOT_FP32=_dot_in_fp32(k_cache), WINDOW=window or 0,
    )
    return out
