"""The compiled CPU kernels against the torch oracle: decode and prefill attention on random paged layouts, with and
without a sliding window shorter than the contexts, the KV store, and a layer's elementwise ops on random rows,
including the strided Q/K views of a fused QKV output."""

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cpu, reference
from kernels.backend import CpuAttention, TorchAttention, select_attention_backend, select_layer_ops
from kernels.cpu_variants import executable_variants


@pytest.fixture(scope="module", params=executable_variants(), ids=lambda variant: variant.name)
def compiled(request):
    """Every ISA variant this CPU can run, each against the torch oracle."""
    module = cpu.load_variant(request.param)
    assert module is not None, f"the {request.param.name} kernels must have been built at install"
    return module


def random_paged_cache(
    generator: torch.Generator, lengths: list[int], block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K and V caches with a few spare blocks, and block tables that scatter each sequence over the pool."""
    widths = [-(-n // block_size) for n in lengths]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros(len(lengths), max(widths), dtype=torch.int32)
    for row, width in enumerate(widths):
        tables[row, :width] = torch.tensor([order.pop() for _ in range(width)])
    return k_cache, v_cache, tables


# Queries and caches of every dtype, in any pairing: an fp32 model may keep its KV cache in fp16 or bf16, and any
# model in fp8 (--kv-cache-dtype fp8, fp8_e5m2).
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
CACHE_DTYPES = DTYPES + FP8


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.float() - expected).abs().max() / expected.abs().max())


def assert_both_paths_match_the_oracle(compiled, name: str, q, k_cache, v_cache, *layout, window=None) -> None:
    """The compiled kernel ``name`` and its torch version, on q and caches of any dtypes, against the torch
    version in fp32 on the same (rounded) cache values."""
    torch_version = getattr(reference, name)
    expected = torch_version(q.float(), k_cache.float(), v_cache.float(), *layout, window=window)
    tolerance = 1e-5 if q.dtype == torch.float32 else 1e-2
    actual = getattr(compiled, name)(q, k_cache, v_cache, *layout, window or 0)
    assert actual.dtype == q.dtype and actual.shape == q.shape
    assert relative_error(actual, expected) < tolerance
    # The torch path, which serves where no compiler is, takes the same mixed dtypes.
    assert relative_error(torch_version(q, k_cache, v_cache, *layout, window=window), expected) < tolerance


def check_decode(compiled, block_size, head_dim, kv_heads, group, lengths, dtype, cache_dtype, window, seed) -> None:
    """Random paged caches and queries of these shapes through the compiled decode kernel, against the oracle."""
    generator = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, block_size, kv_heads, head_dim, cache_dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(len(lengths), kv_heads * group, head_dim, generator=generator).to(dtype)
    assert_both_paths_match_the_oracle(
        compiled, "paged_decode_attention", q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, window=window
    )


# No window, or one shorter than most of the contexts drawn.
WINDOWS = st.one_of(st.none(), st.integers(1, 48))


def test_a_window_changes_what_the_oracle_attends_to():
    """The window is no no-op: the last query of a context longer than it attends to fewer keys."""
    generator = torch.Generator().manual_seed(0)
    k_cache, v_cache, tables = random_paged_cache(generator, [40], 8, 1, 64, torch.float32)
    q, seq_lens = torch.randn(1, 1, 64, generator=generator), torch.tensor([40], dtype=torch.int32)
    whole = reference.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
    windowed = reference.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, window=8)
    assert not torch.allclose(whole, windowed)
    # The window of one key is that key's value.
    last = reference.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, window=1)
    block, offset = tables[0, 39 // 8], 39 % 8
    torch.testing.assert_close(last[0, 0], v_cache[block, offset, 0])


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 80, 128]),
    kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 3, 4, 5, 8]),
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=5),
    dtype=st.sampled_from(DTYPES),
    cache_dtype=st.sampled_from(CACHE_DTYPES),
    window=WINDOWS,
    seed=st.integers(0, 2**16),
)
def test_decode_matches_the_reference(
    compiled, block_size, head_dim, kv_heads, group, lengths, dtype, cache_dtype, window, seed
):
    """With AVX2 a key row's scores come in runs of up to four query heads (groups of five and eight take two) and
    eight tokens' sums are reduced together, the last of a context's tokens however many are left."""
    check_decode(compiled, block_size, head_dim, kv_heads, group, lengths, dtype, cache_dtype, window, seed)


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([32, 64, 96, 128, 256]),
    kv_heads=st.sampled_from([1, 3]),
    group=st.sampled_from([1, 3, 4, 5]),
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=12),
    cache_dtype=st.sampled_from([torch.bfloat16, *FP8]),
    window=WINDOWS,
    seed=st.integers(0, 2**16),
)
def test_bf16_decode_matches_the_reference(
    compiled, block_size, head_dim, kv_heads, group, lengths, cache_dtype, window, seed
):
    """bf16 queries over a bf16 or fp8 cache: on CPUs with AVX512-BF16 their own kernel (bf16 dot products, 16
    tokens' scores per tree of additions, up to four heads' values per pass), with enough sequences for
    whole-sequence tasks and head sizes up to gemma's 256."""
    generator = torch.Generator().manual_seed(seed)
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, block_size, kv_heads, head_dim, cache_dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(len(lengths), kv_heads * group, head_dim, generator=generator).bfloat16()
    assert_both_paths_match_the_oracle(
        compiled, "paged_decode_attention", q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, window=window
    )


@settings(max_examples=25, deadline=None)
@given(
    block_size=st.sampled_from([16, 32]),
    head_dim=st.sampled_from([64, 128]),
    kv_heads=st.sampled_from([1, 3]),
    group=st.sampled_from([1, 3, 5]),
    lengths=st.lists(st.integers(1, 1500), min_size=1, max_size=3).filter(lambda lengths: max(lengths) >= 512),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    cache_dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e4m3fn]),
    window=st.one_of(st.none(), st.integers(1, 1000)),
    seed=st.integers(0, 2**16),
)
def test_decode_of_few_long_sequences_matches_the_reference(
    compiled, block_size, head_dim, kv_heads, group, lengths, dtype, cache_dtype, window, seed
):
    """One to three sequences, one of 512 keys or more: their keys are split into parts that the threads attend
    apart and that are then mixed (kernels/csrc/split_decode.h); a shorter sequence's last parts are empty."""
    check_decode(compiled, block_size, head_dim, kv_heads, group, lengths, dtype, cache_dtype, window, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("winner", [3, 700, 1999])
def test_a_key_that_dominates_one_part_of_a_long_sequence_wins_the_mix(compiled, dtype, winner):
    """Every part's output is normalised over its own keys: the mix must weigh each part by its share of the
    whole softmax, so that one key far above the rest, in whichever part, gives its own value."""
    generator = torch.Generator().manual_seed(winner)
    k_cache, v_cache, tables = random_paged_cache(generator, [2000], 16, 1, 64, torch.float32)
    k_cache *= 0.01
    block, offset = tables[0, winner // 16], winner % 16
    q = torch.zeros(1, 1, 64)
    q[0, 0, 0] = 1.0
    k_cache[block, offset, 0, 0] = 30.0  # a score of 30 against at most about 0.04 for every other key
    out = compiled.paged_decode_attention(q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables,
                                          torch.tensor([2000], dtype=torch.int32), 1.0, 0)
    torch.testing.assert_close(out[0, 0].float(), v_cache[block, offset, 0].to(dtype).float(), rtol=0.02, atol=0.02)


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 80]),
    kv_heads=st.sampled_from([1, 3]),
    group=st.sampled_from([1, 3, 4]),
    # (cached prefix, new tokens) per sequence; more than 32 new tokens spans several query tiles
    sequences=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 75)), min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    cache_dtype=st.sampled_from(CACHE_DTYPES),
    window=WINDOWS,
    seed=st.integers(0, 2**16),
)
def test_prefill_matches_the_reference(
    compiled, block_size, head_dim, kv_heads, group, sequences, dtype, cache_dtype, window, seed
):
    generator = torch.Generator().manual_seed(seed)
    lengths = [cached + new for cached, new in sequences]
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, block_size, kv_heads, head_dim, cache_dtype)
    cu_seqlens = torch.tensor([0] + [new for _, new in sequences], dtype=torch.int32).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    num_heads = kv_heads * group
    # Q as a strided view, the way it leaves a fused QKV projection.
    fused = torch.randn(int(cu_seqlens[-1]), (num_heads + 2) * head_dim, generator=generator).to(dtype)
    q = fused[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
    assert_both_paths_match_the_oracle(
        compiled, "paged_prefill_attention", q, k_cache, v_cache, tables, cu_seqlens, seq_lens, head_dim**-0.5,
        window=window,
    )


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([32, 64, 128, 256]),
    kv_heads=st.sampled_from([1, 3]),
    group=st.sampled_from([1, 3, 5]),
    sequences=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 75)), min_size=1, max_size=4),
    cache_dtype=st.sampled_from([torch.bfloat16, *FP8]),
    window=WINDOWS,
    seed=st.integers(0, 2**16),
)
def test_bf16_prefill_matches_the_reference(
    compiled, block_size, head_dim, kv_heads, group, sequences, cache_dtype, window, seed
):
    """bf16 queries over a bf16 or fp8 cache: on CPUs with AVX512-BF16 their own kernel (the decode kernel's bf16
    dot products and value sums, rows masked causally and to the window), up to gemma's head size of 256."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [cached + new for cached, new in sequences]
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, block_size, kv_heads, head_dim, cache_dtype)
    cu_seqlens = torch.tensor([0] + [new for _, new in sequences], dtype=torch.int32).cumsum(0).to(torch.int32)
    num_heads = kv_heads * group
    fused = torch.randn(int(cu_seqlens[-1]), (num_heads + 2) * head_dim, generator=generator).bfloat16()
    q = fused[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
    assert_both_paths_match_the_oracle(
        compiled, "paged_prefill_attention", q, k_cache, v_cache, tables, cu_seqlens,
        torch.tensor(lengths, dtype=torch.int32), head_dim**-0.5, window=window,
    )


@settings(max_examples=12, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 256]),
    sequences=st.lists(st.tuples(st.integers(0, 700), st.integers(1, 200)), min_size=1, max_size=3),
    cache_dtype=st.sampled_from([torch.bfloat16, torch.float8_e4m3fn]),
    window=st.one_of(st.none(), st.integers(1, 400)),
    seed=st.integers(0, 2**16),
)
def test_bf16_prefill_over_long_contexts_matches_the_reference(
    compiled, block_size, head_dim, sequences, cache_dtype, window, seed
):
    """Hundreds of cached keys and prompts of many query tiles (SmolLM2's 3 KV heads of 3 query heads each): with
    AMX, many 32-key steps of the tiles' online softmax, windows that begin inside a step, and a last step past the
    context."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [cached + new for cached, new in sequences]
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, block_size, 3, head_dim, cache_dtype)
    cu_seqlens = torch.tensor([0] + [new for _, new in sequences], dtype=torch.int32).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu_seqlens[-1]), 9, head_dim, generator=generator).bfloat16()
    assert_both_paths_match_the_oracle(
        compiled, "paged_prefill_attention", q, k_cache, v_cache, tables, cu_seqlens,
        torch.tensor(lengths, dtype=torch.int32), head_dim**-0.5, window=window,
    )


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_prefill_follows_scores_that_rise_along_the_context(compiled, head_dim):
    """Every key scores above the one before it, by 80 or more over the context, so that each token's running
    maximum moves again and again: with AMX, its reference and the output summed so far are rescaled (in the tiles'
    registers at 64 dimensions, in memory at 128)."""
    generator = torch.Generator().manual_seed(3)
    k_cache, v_cache, tables = random_paged_cache(generator, [400], 16, 1, head_dim, torch.bfloat16)
    direction = torch.randint(0, 2, (head_dim,), generator=generator).float() * 2 - 1
    for position in range(400):
        k_cache[tables[0, position // 16], position % 16, 0] = (direction * position / 40).bfloat16()
    q = direction.expand(100, 3, head_dim).bfloat16()
    cu_seqlens = torch.tensor([0, 100], dtype=torch.int32)
    assert_both_paths_match_the_oracle(
        compiled, "paged_prefill_attention", q, k_cache, v_cache, tables, cu_seqlens,
        torch.tensor([400], dtype=torch.int32), head_dim**-0.5,
    )


@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize(("dtype", "cache_dtype"), [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16),
                                                    (torch.float32, torch.float32)])
def test_prefill_gives_a_token_the_same_bits_however_its_prompt_is_chunked(compiled, window, dtype, cache_dtype):
    """What the batch-invariant backend relies on: a prompt's last rows, attended as a later chunk over the cached
    rest and beside another sequence, are the bits they are when the whole prompt is one chunk. fp32 queries over
    an fp16 cache are Zen 3's default; there each row's scores and sums are one chain of FMAs wherever the row
    falls in a tile (the rows past the last whole tile once took another, scalar, chain)."""
    generator = torch.Generator().manual_seed(7)
    lengths = [300, 90]
    k_cache, v_cache, tables = random_paged_cache(generator, lengths, 16, 3, 64, cache_dtype)
    q = torch.randn(300, 9, 64, generator=generator).to(dtype)
    other = torch.randn(90, 9, 64, generator=generator).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)

    def attend(queries: torch.Tensor, new: list[int]) -> torch.Tensor:
        cu_seqlens = torch.tensor([0, *new], dtype=torch.int32).cumsum(0).to(torch.int32)
        return compiled.paged_prefill_attention(queries, k_cache, v_cache, tables, cu_seqlens, seq_lens, 0.125, window)

    whole = attend(torch.cat([q, other]), [300, 90])[:300]
    for first in (1, 77, 250, 299):
        chunk = attend(torch.cat([q[first:], other[60:]]), [300 - first, 30])[: 300 - first]
        assert torch.equal(bits(chunk), bits(whole[first:])), first


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@settings(max_examples=20, deadline=None)
@given(
    tokens=st.integers(1, 40),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    cache_dtype=st.sampled_from([None, *FP8]),
    seed=st.integers(0, 2**16),
)
def test_store_kv_matches_the_reference(compiled, tokens, dtype, cache_dtype, seed):
    """Into a cache of the rows' dtype, or an fp8 one, with values past fp8's range (e4m3 saturates)."""
    generator = torch.Generator().manual_seed(seed)
    kv_heads, head_dim = 3, 64
    shape = (12, 8, kv_heads, head_dim)
    fused = (torch.randn(tokens, 3 * kv_heads * head_dim, generator=generator) * 200).to(dtype)
    k = fused[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    v = fused[:, 2 * kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(shape[0] * shape[1], generator=generator)[:tokens]
    slots[torch.rand(tokens, generator=generator) < 0.2] = -1  # tokens whose K/V are already cached
    caches = [torch.randn(shape, generator=generator).to(cache_dtype or dtype) for _ in range(2)]
    expected = [cache.clone() for cache in caches]
    reference.store_kv(k, v, *expected, slots)
    compiled.store_kv(k, v, *caches, slots)
    assert torch.equal(bits(caches[0]), bits(expected[0])) and torch.equal(bits(caches[1]), bits(expected[1]))
    written = slots[slots >= 0]
    assert torch.equal(bits(expected[0].view(-1, kv_heads, head_dim)[written]),
                       bits(k[slots >= 0].to(caches[0].dtype)))
    with pytest.raises(RuntimeError, match="outside the cache"):
        compiled.store_kv(k, v, *caches, torch.full((tokens,), shape[0] * shape[1]))


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_fp8_value_is_read_exactly(compiled, cache_dtype, dtype):
    """Each finite fp8 value, subnormals and both zeros included, as the value row of a one-token context: the
    output is that row, exactly, in either kernel (bf16 queries, or fp32 through the AVX2 path)."""
    values = torch.arange(256, dtype=torch.uint8).view(cache_dtype)
    values = values[torch.isfinite(values.float())]
    head_dim = 64
    rows = torch.cat([values, values[: -values.numel() % head_dim]]).view(-1, head_dim)
    v_cache = torch.zeros(len(rows), 8, 1, head_dim, dtype=cache_dtype)
    v_cache[:, 0, 0] = rows
    tables = torch.arange(len(rows), dtype=torch.int32)[:, None]
    q = torch.randn(len(rows), 1, head_dim).to(dtype)
    out = compiled.paged_decode_attention(q, torch.zeros_like(v_cache), v_cache, tables,
                                          torch.ones(len(rows), dtype=torch.int32), 1.0, 0)
    assert torch.equal(out[:, 0].float(), rows.float())


def test_cpu_tensors_take_the_compiled_kernel_by_default(compiled, monkeypatch):
    monkeypatch.delenv("VIGIL_ATTENTION_BACKEND", raising=False)
    backend = select_attention_backend(torch.device("cpu"))
    assert isinstance(backend, CpuAttention) and backend.name == "cpu" and backend.compiled is cpu.load()
    monkeypatch.setenv("VIGIL_ATTENTION_BACKEND", "torch")
    assert isinstance(select_attention_backend(torch.device("cpu")), TorchAttention)
    monkeypatch.setenv("VIGIL_ATTENTION_BACKEND", "cuda-magic")
    with pytest.raises(ValueError, match="VIGIL_ATTENTION_BACKEND"):
        select_attention_backend(torch.device("cpu"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    relative = (actual.float() - expected.float()).abs().max() / expected.float().abs().max()
    assert relative < (2e-6 if dtype == torch.float32 else 1e-2), relative


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 9),
    heads=st.sampled_from([(2, 1), (9, 3), (4, 4)]),
    head_dim=st.sampled_from([8, 64]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_layer_ops_match_the_reference(compiled, tokens, heads, head_dim, dtype, seed):
    ops = select_layer_ops(torch.device("cpu"))
    assert ops.name == "cpu"
    generator = torch.Generator().manual_seed(seed)
    num_heads, kv_heads = heads
    width = num_heads * head_dim

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    hidden, delta, weight = rand(tokens, width), rand(tokens, width), rand(width)
    assert_close(ops.rms_norm(hidden, weight, 1e-5), reference.rms_norm(hidden, weight, 1e-5), dtype)
    expected_hidden, expected_normed = reference.add_rms_norm(hidden, delta, weight, 1e-5)
    summed, normed = ops.add_rms_norm(hidden.clone(), delta, weight, 1e-5)
    assert_close(summed, expected_hidden, dtype)
    assert_close(normed, expected_normed, dtype)

    gate_up = rand(tokens, 2 * width, scale=4.0)  # wide enough to reach SiLU's saturated ends
    assert_close(ops.silu_mul(gate_up), reference.silu_mul(gate_up), dtype)

    angles = torch.rand(64, head_dim // 2, generator=generator) * 100
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    positions = torch.randint(0, 64, (tokens,), generator=generator)
    qkv = rand(tokens, (num_heads + 2 * kv_heads) * head_dim)
    expected_q, expected_k = reference.rotary(
        positions, qkv[:, :width].view(tokens, num_heads, head_dim),
        qkv[:, width : width + kv_heads * head_dim].view(tokens, kv_heads, head_dim), cos, sin,
    )
    q, k, _ = qkv.split([width, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    rotated_q, rotated_k = ops.rotary(
        positions, q.view(tokens, num_heads, head_dim), k.view(tokens, kv_heads, head_dim), cos, sin
    )
    assert_close(rotated_q, expected_q, dtype)
    assert_close(rotated_k, expected_k, dtype)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 9),
    width=st.integers(1, 3000),
    values=st.integers(2, 1000),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_greedy_tokens_are_argmax_with_its_first_index_on_ties(compiled, rows, width, values, dtype, seed):
    """Few distinct values make ties in every row; the first row is all -inf (every token refused)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, values, (rows, width), generator=generator).to(dtype)
    logits[0] = float("-inf")
    expected = logits.float().argmax(dim=-1)
    assert torch.equal(select_layer_ops(torch.device("cpu")).greedy_tokens(logits), expected)
    assert torch.equal(reference.greedy_tokens(logits), expected)
    wide = torch.cat((logits, logits), dim=-1)[:, :width]  # rows with a stride past their width
    assert torch.equal(compiled.greedy_tokens(wide), expected)
    assert torch.equal(compiled.greedy_tokens(logits.t().contiguous().t()), expected)  # not contiguous in a row


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_bf16_linear_kernels_are_fp32_sums_of_the_bf16_products(compiled, rows):
    """Each variant's few-rows and row-invariant kernels (AVX512-BF16 dot products or widened to fp32), and AMX's
    where it runs: fp32 sums of the bf16 products, rounded once to bf16."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 256, generator=generator).bfloat16()
    x = torch.randn(rows, 256, generator=generator).bfloat16()
    expected = torch.nn.functional.linear(x.float(), weight.float())
    outputs = [compiled.few_rows_linear(x, weight), compiled.row_invariant_linear(x, weight)]
    if compiled.amx_linear_usable():
        outputs.append(compiled.amx_linear(x, compiled.amx_pack_weight(weight), 96))
    for out in outputs:
        torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=2**-8 * expected.abs().max().item())


def test_python_runs_on_while_a_kernel_runs_on_another_thread(compiled):
    """The kernels let go of Python's lock: while the engine's thread is inside a long prefill attention, another
    thread (the server's event loop) keeps running Python. Held, the other thread would stop for the whole call."""
    generator = torch.Generator().manual_seed(0)
    tokens, heads, head_dim, block_size = 4096, 8, 64, 16
    k_cache, v_cache, tables = random_paged_cache(generator, [tokens], block_size, heads, head_dim, torch.float32)
    q = torch.randn(tokens, heads, head_dim, generator=generator)
    layout = (tables, torch.tensor([0, tokens], dtype=torch.int32), torch.tensor([tokens], dtype=torch.int32))
    call: dict[str, float] = {}

    def attend() -> None:
        call["start"] = time.perf_counter()
        compiled.paged_prefill_attention(q, k_cache, v_cache, *layout, head_dim**-0.5, 0)
        call["end"] = time.perf_counter()

    thread = threading.Thread(target=attend)
    longest_gap, last = 0.0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        now = time.perf_counter()
        longest_gap, last = max(longest_gap, now - last), now
    thread.join()
    duration = call["end"] - call["start"]
    assert duration > 0.02, "the call must last long enough to tell the two apart"
    assert max(longest_gap, time.perf_counter() - last) < duration / 2
