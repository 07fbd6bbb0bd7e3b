"""Triton store_kv (run by the Triton interpreter on CPU): exactly the mapped slots change, to k and v."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cache_ops, reference

CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def written_slots(cache: torch.Tensor) -> torch.Tensor:
    """Sorted slots of a NaN-initialized cache that now hold numbers."""
    flat = cache.view(-1, cache.shape[2] * cache.shape[3])
    return (~flat.isnan().all(dim=1)).nonzero().flatten()


def strided_kv(
    num_tokens: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as views into one fused projection output, as a model produces them (not contiguous)."""
    fused = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=gen).to(dtype)
    return fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]


@settings(max_examples=15, deadline=None)
@given(
    num_tokens=st.integers(1, 12),
    num_kv_heads=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([8, 16, 32]),
    cache_dtype=st.sampled_from(CACHE_DTYPES),
    source_fp32=st.booleans(),
    slot_dtype=st.sampled_from([torch.int32, torch.int64]),
    skip_chance=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 2**31 - 1),
)
def test_store_kv_writes_exactly_the_mapped_slots(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, cache_dtype: torch.dtype,
    source_fp32: bool, slot_dtype: torch.dtype, skip_chance: float, seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 2
    source_dtype = torch.float32 if source_fp32 else cache_dtype
    k, v = strided_kv(num_tokens, num_kv_heads, head_dim, source_dtype, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    skipped = torch.rand(num_tokens, generator=gen) < skip_chance
    slot_mapping = slots.masked_fill(skipped, -1).to(slot_dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=cache_dtype)
    v_cache = torch.full(shape, float("nan"), dtype=cache_dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()

    cache_ops.store_kv(k, v, k_cache, v_cache, slot_mapping)

    reference.store_kv(k, v, expected_k, expected_v, slot_mapping)
    kept = ~skipped
    assert torch.equal(written_slots(k_cache), slots[kept].sort().values)
    assert torch.equal(written_slots(v_cache), slots[kept].sort().values)
    # Copies are exact; a conversion may differ by one unit in the last place, because the interpreter
    # truncates fp32 to bf16 where torch and compiled Triton round to nearest.
    rtol = 0.0 if source_dtype == cache_dtype else torch.finfo(cache_dtype).eps
    flat_k, flat_v = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    torch.testing.assert_close(flat_k[slots[kept]], k[kept].to(cache_dtype), rtol=rtol, atol=0)
    torch.testing.assert_close(flat_v[slots[kept]], v[kept].to(cache_dtype), rtol=rtol, atol=0)
    torch.testing.assert_close(k_cache, expected_k, rtol=rtol, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, expected_v, rtol=rtol, atol=0, equal_nan=True)


def test_store_kv_skipped_slots_leave_cache_untouched() -> None:
    gen = torch.Generator().manual_seed(0)
    k, v = strided_kv(5, 2, 64, torch.bfloat16, gen)
    k_cache = torch.randn(3, 8, 2, 64, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(3, 8, 2, 64, generator=gen).to(torch.bfloat16)
    before_k, before_v = k_cache.clone(), v_cache.clone()

    cache_ops.store_kv(k, v, k_cache, v_cache, torch.full((5,), -1, dtype=torch.int64))

    assert torch.equal(k_cache, before_k)
    assert torch.equal(v_cache, before_v)
