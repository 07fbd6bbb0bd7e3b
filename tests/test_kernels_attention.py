"""Triton paged attention against the torch reference (run by the Triton interpreter on CPU).

Relative error is ``max |out - ref| / max |ref|``, with the reference computed in fp32 from the same
(possibly low-precision) inputs. Every output buffer starts as NaN, and every cache slot outside the
sequences' contexts is NaN too, so an unwritten output or a read past a context shows up as NaN.
The reference gets a copy of the caches with those slots zeroed: its decode path reads whole blocks
of every table and would spread the NaN itself.
"""

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import paged_attention, reference

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LENGTH_KINDS = ("one", "below_block", "block", "above_block", "long")
SCALE_DIM = {64: 1 / 8, 128: 1 / math.sqrt(128)}


def context_length(kind: str, block_size: int) -> int:
    return {
        "one": 1,
        "below_block": block_size - 1,
        "block": block_size,
        "above_block": block_size + 1,
        "long": 4 * block_size - 3,
    }[kind]


@dataclass
class PagedCase:
    k_cache: torch.Tensor  # unused slots are NaN
    v_cache: torch.Tensor
    clean_k_cache: torch.Tensor  # unused slots are zero
    clean_v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor


def make_paged_case(
    seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
    gen: torch.Generator,
) -> PagedCase:
    """Caches with each sequence's blocks at shuffled ids; tables padded one column past the need."""
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + 2
    width = max(blocks_needed) + 1
    tables = torch.randint(0, num_blocks, (len(seq_lens), width), generator=gen)
    shuffled = torch.randperm(num_blocks, generator=gen)
    used = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    taken = 0
    for i, (length, count) in enumerate(zip(seq_lens, blocks_needed, strict=True)):
        tables[i, :count] = shuffled[taken : taken + count]
        used.view(-1)[(tables[i, :count, None] * block_size + torch.arange(block_size)).view(-1)[:length]] = True
        taken += count
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    clean = [torch.randn(shape, generator=gen).to(dtype).masked_fill(~used[..., None, None], 0) for _ in "kv"]
    poisoned = [c.masked_fill(~used[..., None, None], float("nan")) for c in clean]
    return PagedCase(
        *poisoned, *clean, tables.to(torch.int32), torch.tensor(seq_lens, dtype=torch.int32)
    )


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.float() - expected).abs().max() / expected.abs().max()).item()


def nan_like(q: torch.Tensor) -> torch.Tensor:
    return torch.full_like(q, float("nan"))


def check_decode(
    lengths: list[int], block_size: int, num_kv_heads: int, group: int, head_dim: int,
    dtype: torch.dtype, partition_size: int | None, seed: int, window: int | None = None,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    case = make_paged_case(lengths, block_size, num_kv_heads, head_dim, dtype, gen)
    q = torch.randn(len(lengths), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    scale = SCALE_DIM[head_dim]
    out = nan_like(q)

    result = paged_attention.paged_decode_attention(
        q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, scale,
        out=out, partition_size=partition_size, window=window,
    )

    expected = reference.paged_decode_attention(
        q.float(), case.clean_k_cache.float(), case.clean_v_cache.float(), case.block_tables, case.seq_lens, scale,
        window=window,
    )
    assert result is out and out.dtype == dtype
    assert not out.isnan().any()
    assert relative_error(out, expected) < TOLERANCE[dtype]


def check_prefill(
    contexts: list[tuple[int, int]], block_size: int, num_kv_heads: int, group: int, head_dim: int,
    dtype: torch.dtype, seed: int, window: int | None = None,
) -> None:
    """``contexts`` holds each sequence's ``(cached prefix length, new token count)``."""
    gen = torch.Generator().manual_seed(seed)
    case = make_paged_case([p + n for p, n in contexts], block_size, num_kv_heads, head_dim, dtype, gen)
    cu_seqlens_q = torch.tensor([0, *torch.tensor([n for _, n in contexts]).cumsum(0)], dtype=torch.int32)
    q = torch.randn(int(cu_seqlens_q[-1]), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    scale = SCALE_DIM[head_dim]
    out = nan_like(q)

    result = paged_attention.paged_prefill_attention(
        q, case.k_cache, case.v_cache, case.block_tables, cu_seqlens_q, case.seq_lens, scale, out=out, window=window
    )

    expected = reference.paged_prefill_attention(
        q.float(), case.clean_k_cache.float(), case.clean_v_cache.float(), case.block_tables, cu_seqlens_q,
        case.seq_lens, scale, window=window,
    )
    assert result is out and out.dtype == dtype
    assert not out.isnan().any()
    assert relative_error(out, expected) < TOLERANCE[dtype]


@settings(max_examples=20, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(LENGTH_KINDS), min_size=1, max_size=4),
    block_size=st.sampled_from([8, 16, 32]),
    num_kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    dtype=st.sampled_from(DTYPES),
    partition_size=st.sampled_from([None, 32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_decode_matches_reference(
    kinds: list[str], block_size: int, num_kv_heads: int, group: int, dtype: torch.dtype,
    partition_size: int | None, seed: int,
) -> None:
    lengths = [context_length(kind, block_size) for kind in kinds]
    check_decode(lengths, block_size, num_kv_heads, group, 64, dtype, partition_size, seed)


@pytest.mark.parametrize(
    ("block_size", "head_dim", "dtype"),
    [
        (8, 64, torch.bfloat16),
        (8, 128, torch.float32),
        (16, 64, torch.float16),
        (16, 128, torch.bfloat16),
        (32, 64, torch.float32),
        (32, 128, torch.float16),
    ],
)
def test_decode_many_partitions(block_size: int, head_dim: int, dtype: torch.dtype) -> None:
    """Four 32-token partitions for the longest sequence; the shorter ones leave partitions empty."""
    check_decode([101, 1, block_size + 1], block_size, 2, 4, head_dim, dtype, 32, seed=block_size + head_dim)


def test_decode_ratio_eight_default_partition() -> None:
    check_decode([3, 70], 16, 1, 8, 64, torch.bfloat16, None, seed=7)


@st.composite
def prefill_batches(draw: st.DrawFn, block_size: int) -> list[tuple[int, int]]:
    """A batch mixing a fully new sequence, a long cached prefix with 1-3 new tokens, and random others."""
    long_prefix = context_length("long", block_size)
    whole = (0, context_length(draw(st.sampled_from(LENGTH_KINDS)), block_size))
    cached = (long_prefix, draw(st.integers(1, 3)))
    extra = draw(
        st.lists(
            st.tuples(st.sampled_from([0, 1, block_size, long_prefix]), st.sampled_from([0, 1, 2, block_size + 1]))
            .filter(lambda ctx: sum(ctx) > 0),
            max_size=2,
        )
    )
    return draw(st.permutations([whole, cached, *extra]))


@settings(max_examples=15, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([8, 16, 32]),
    num_kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3, 4]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_prefill_matches_reference(
    data: st.DataObject, block_size: int, num_kv_heads: int, group: int, dtype: torch.dtype, seed: int
) -> None:
    contexts = data.draw(prefill_batches(block_size))
    check_prefill(contexts, block_size, num_kv_heads, group, 64, dtype, seed)


@pytest.mark.parametrize(
    ("block_size", "head_dim", "dtype"),
    [
        (8, 128, torch.bfloat16),
        (16, 64, torch.float32),
        (32, 128, torch.float16),
    ],
)
def test_prefill_chunked_and_empty(block_size: int, head_dim: int, dtype: torch.dtype) -> None:
    """Zero new tokens first and last, a chunk after a cached prefix, and a fresh prompt."""
    contexts = [(block_size, 0), (block_size + 3, block_size - 1), (0, block_size + 1), (2 * block_size, 0)]
    check_prefill(contexts, block_size, 2, 3, head_dim, dtype, seed=block_size)


def test_prefill_ratio_eight() -> None:
    check_prefill([(5, 6), (0, 9)], 16, 1, 8, 64, torch.float32, seed=3)


@settings(max_examples=10, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(LENGTH_KINDS), min_size=1, max_size=3),
    block_size=st.sampled_from([8, 16]),
    window=st.integers(1, 40),
    partition_size=st.sampled_from([None, 32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_decode_with_a_sliding_window(
    kinds: list[str], block_size: int, window: int, partition_size: int | None, seed: int
) -> None:
    """Contexts up to 61 tokens against windows down to one key; with 32-token partitions, whole partitions fall
    before the window and must weigh nothing in the merge."""
    lengths = [context_length(kind, block_size) for kind in kinds]
    check_decode(lengths, block_size, 2, 3, 64, torch.float32, partition_size, seed, window=window)


@settings(max_examples=10, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([8, 16]),
    window=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_prefill_with_a_sliding_window(data: st.DataObject, block_size: int, window: int, seed: int) -> None:
    """Chunks after long cached prefixes and fresh prompts longer than the window: a query tile's later rows see
    nothing in its first key tiles."""
    contexts = data.draw(prefill_batches(block_size))
    check_prefill(contexts, block_size, 2, 3, 64, torch.float32, seed, window=window)


@pytest.mark.parametrize(
    ("capacity", "programs", "num_sms", "expected"),
    [
        (16384, 8, 132, 512),  # one sequence: 32 partitions, capped at the maximum size
        (4096, 8, 132, 128),  # one sequence, shorter: about 2 programs per SM
        (512, 8, 132, 32),  # clamped at the minimum size
        (4096, 512, 132, 512),  # a full batch needs no splitting for occupancy
        (40, 4, 1, 64),  # one SM, already busy: a single partition
    ],
)
def test_decode_partition_size(capacity: int, programs: int, num_sms: int, expected: int) -> None:
    assert paged_attention.decode_partition_size(capacity, programs, num_sms) == expected
