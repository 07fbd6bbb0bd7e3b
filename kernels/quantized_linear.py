"""Triton weight-only quantised linear layers: ``x · Wᵀ`` with W kept as int8 or packed int4
(server/models/quantization.py), the signatures and results of ``kernels.reference``'s ``int8_linear`` and
``int4_linear``.

Each program computes a ``[BLOCK_M, BLOCK_N]`` tile of the output over a range of K: it loads the codes, dequantises
them in registers and accumulates in fp32 with ``tl.dot``. Decoding has too few output tiles to fill the GPU
(one row times 576 outputs is 9 tiles), so K is split across programs until there are about ``_TARGET_PROGRAMS``;
their fp32 partial sums are then added by torch.
"""

import os

import torch
import triton
import triton.language as tl

# The interpreter mishandles low-precision tl.dot.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

_BLOCK_N = 64
_BLOCK_K = 128
_MAX_BLOCK_M = 64
_TARGET_PROGRAMS = 128  # about one per SM of a datacenter GPU
_Q4_BLOCK = 32


# DOT_FP32 (fp32 activations, and every dtype under the interpreter) multiplies in fp32 as tf32x3, as
# paged_attention.py does; otherwise the weights are rounded to the activations' dtype.
@triton.jit
def _dot(x, w, DOT_FP32: tl.constexpr):
    """``x @ w`` in fp32 for activations ``x`` ``[M, K]`` and weights ``w`` ``[K, N]`` (codes or values)."""
    if DOT_FP32:
        return tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="tf32x3")
    return tl.dot(x, w.to(x.dtype))


@triton.jit
def _int8_linear_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_split,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One output tile over one split of K. The codes are multiplied as they are (every int8 is exact in fp16
    and bf16) and each output channel's scale is applied once, at the end."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    w_rows = w_ptr + cols.to(tl.int64) * K
    k_begin = tl.program_id(2) * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        codes = tl.load(w_rows[None, :] + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0)
        acc += _dot(x, codes, DOT_FP32)
    acc *= tl.load(scales_ptr + cols, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + tl.program_id(2) * stride_split + rows[:, None] * N + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_linear_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    mins_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_split,
    k_per_split,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """One output tile over one split of K, a 32-feature block at a time. Byte ``i`` of a block holds feature ``i``
    in its low nibble and feature ``i + 16`` in its high nibble (Q4_1's layout), so a block is two products: the
    low nibbles with the block's first 16 activations, the high nibbles with its last 16. The block's group scale
    and minimum are one load per output channel, broadcast over its 16 bytes."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    cols64 = cols.to(tl.int64)
    w_rows = w_ptr + cols64 * (K // 2)
    group_rows = cols64 * (K // GROUP)
    half = tl.arange(0, 16)
    k_begin = tl.program_id(2) * k_per_split
    k_end = tl.minimum(K, k_begin + k_per_split)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        for block in tl.static_range(BLOCK_K // 32):
            start = k0 + block * 32
            w_ok = (start < K) & col_ok
            packed = tl.load(w_rows[None, :] + (start // 2 + half)[:, None], mask=w_ok[None, :], other=0)
            scale = tl.load(scales_ptr + group_rows + start // GROUP, mask=w_ok, other=0.0).to(tl.float32)[None, :]
            minimum = tl.load(mins_ptr + group_rows + start // GROUP, mask=w_ok, other=0.0).to(tl.float32)[None, :]
            w_low = (packed & 0xF).to(tl.float32) * scale + minimum
            w_high = (packed >> 4).to(tl.float32) * scale + minimum
            x_rows = x_ptr + rows[:, None] * stride_xm + (start + half)[None, :]
            x_ok = row_ok[:, None] & (start < K)
            x_low = tl.load(x_rows, mask=x_ok, other=0.0)
            x_high = tl.load(x_rows + 16, mask=x_ok, other=0.0)
            acc += _dot(x_low, w_low, DOT_FP32) + _dot(x_high, w_high, DOT_FP32)
    out = out_ptr + tl.program_id(2) * stride_split + rows[:, None] * N + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check(x: torch.Tensor, weights: tuple[torch.Tensor, ...], k: int) -> None:
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"x must be [tokens, {k}] with contiguous rows, not {tuple(x.shape)}")
    if not all(w.is_contiguous() and w.device == x.device for w in weights):
        raise ValueError("the quantised weights must be contiguous and on x's device")


def _launch(
    kernel: triton.JITFunction, x: torch.Tensor, weights: tuple[torch.Tensor, ...], n: int, **constexprs: int
) -> torch.Tensor:
    m, k = x.shape
    if m == 0:
        return x.new_empty((0, n))
    block_m = min(_MAX_BLOCK_M, max(16, triton.next_power_of_2(m)))
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, _BLOCK_N)
    k_tiles = triton.cdiv(k, _BLOCK_K)
    tiles_per_split = triton.cdiv(k_tiles, min(k_tiles, max(1, _TARGET_PROGRAMS // tiles)))
    splits = triton.cdiv(k_tiles, tiles_per_split)
    out = torch.empty((splits, m, n), dtype=x.dtype if splits == 1 else torch.float32, device=x.device)
    kernel[(triton.cdiv(m, block_m), triton.cdiv(n, _BLOCK_N), splits)](
        x,
        *weights,
        out,
        m,
        n,
        k,
        x.stride(0),
        m * n,
        tiles_per_split * _BLOCK_K,
        BLOCK_M=block_m,
        BLOCK_N=_BLOCK_N,
        BLOCK_K=_BLOCK_K,
        DOT_FP32=_INTERPRET or x.dtype == torch.float32,
        num_warps=4,
        # Tiles of fp32 activations take twice the shared memory: three stages of them overflow the 99 KiB of a
        # consumer GPU.
        num_stages=2 if x.dtype == torch.float32 else 3,
        **constexprs,
    )
    return out[0] if splits == 1 else out.sum(0).to(x.dtype)


def int8_linear(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x · Wᵀ`` for int8 W ``[N, K]`` with one fp32 scale per output channel (``[N, 1]``), in x's dtype."""
    n, k = w.shape
    _check(x, (w, scales), k)
    if scales.shape != (n, 1):
        raise ValueError(f"int8 scales must be one per output channel, [{n}, 1], not {tuple(scales.shape)}")
    return _launch(_int8_linear_kernel, x, (w, scales), n)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """``x · Wᵀ`` for W packed as Q4_1 blocks (uint8 ``[N, K / 2]``) with fp16 scales and minimums
    ``[N, groups]`` (groups of a multiple of 32 features), in x's dtype."""
    n, k = packed.shape[0], 2 * packed.shape[1]
    _check(x, (packed, scales, mins), k)
    groups = scales.shape[1]
    if mins.shape != scales.shape or scales.shape[0] != n or k % (groups * _Q4_BLOCK):
        raise ValueError(
            f"int4 needs [{n}, groups] scales and mins over groups of a multiple of 32 features, "
            f"not {tuple(scales.shape)} and {tuple(mins.shape)} for {k} features"
        )
    return _launch(_int4_linear_kernel, x, (packed, scales, mins), n, GROUP=k // groups)
