"""The attention backend interface: prepare() once, forward() per layer, on a step that mixes decodes with chunked
prefills over cached prefixes; every backend stores the same K/V and attends as the torch oracle does, with or
without a sliding window."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cpu
from kernels.backend import (
    AttentionBackend,
    AttentionBatch,
    BatchInvariantCpuAttention,
    CpuAttention,
    TorchAttention,
    TritonAttention,
)

BLOCK_SIZE, NUM_BLOCKS, KV_HEADS, HEADS, HEAD_DIM = 16, 40, 2, 6, 64
DEVICE = torch.device("cpu")


def backends() -> list[AttentionBackend]:
    compiled = cpu.load()
    assert compiled is not None, "the C++ kernels must build on this machine (g++ and ninja)"
    return [CpuAttention(DEVICE, compiled), TritonAttention(DEVICE)]


def mixed_batch(decode_lens: list[int], prefills: list[tuple[int, int]], generator: torch.Generator) -> AttentionBatch:
    """Decodes at context lengths ``decode_lens``, then (cached, new) prefill chunks, over scattered blocks."""
    order = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
    lengths = decode_lens + [cached + new for cached, new in prefills]
    tables = [[order.pop() for _ in range(-(-n // BLOCK_SIZE))] for n in lengths]
    new_tokens = [1] * len(decode_lens) + [new for _, new in prefills]
    slots = [
        table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        for table, length, new in zip(tables, lengths, new_tokens, strict=True)
        for pos in range(length - new, length)
    ]
    starts = [0]
    for _, new in prefills:
        starts.append(starts[-1] + new)
    num_decode = len(decode_lens)
    return AttentionBatch(
        slot_mapping=slots,
        decode_block_tables=tables[:num_decode],
        decode_seq_lens=decode_lens,
        prefill_block_tables=tables[num_decode:],
        prefill_query_starts=starts,
        prefill_seq_lens=lengths[num_decode:],
    )


def attend(backend: AttentionBackend, batch: AttentionBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           caches: list[torch.Tensor]) -> torch.Tensor:
    """One layer's forward over copies of the caches."""
    copies = [cache.clone() for cache in caches]
    return backend.forward(q, k, v, (copies[0], copies[1]), backend.prepare(batch), HEAD_DIM**-0.5)


@settings(max_examples=15, deadline=None)
@given(
    decode_lens=st.lists(st.integers(1, 90), max_size=3),
    prefills=st.lists(st.tuples(st.integers(0, 60), st.integers(2, 40)), max_size=3),
    window=st.one_of(st.none(), st.integers(1, 50)),
    seed=st.integers(0, 2**16),
)
def test_every_backend_stores_and_attends_as_the_oracle(decode_lens, prefills, window, seed):
    if not decode_lens and not prefills:
        return
    generator = torch.Generator().manual_seed(seed)
    batch = mixed_batch(decode_lens, prefills, generator)
    num_tokens = len(batch.slot_mapping)
    q = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    start_caches = [torch.randn(shape, generator=generator) for _ in range(2)]

    def run(backend: AttentionBackend) -> tuple[torch.Tensor, list[torch.Tensor]]:
        caches = [cache.clone() for cache in start_caches]
        out = backend.forward(q, k, v, (caches[0], caches[1]), backend.prepare(batch), HEAD_DIM**-0.5, window)
        return out, caches

    expected, expected_caches = run(TorchAttention(DEVICE))
    for backend in backends():
        out, caches = run(backend)
        assert all(torch.equal(a, b) for a, b in zip(caches, expected_caches, strict=True)), backend.name
        assert out.shape == q.shape
        assert float((out - expected).abs().max()) < 1e-4, backend.name


@settings(max_examples=20, deadline=None)
@given(
    decode_lens=st.lists(st.integers(1, 90), max_size=2),
    prefills=st.lists(st.tuples(st.sampled_from([0, 0, 16, 20]), st.sampled_from([5, 16, 33])), min_size=1, max_size=5),
    dtypes=st.sampled_from([
        (torch.float32, torch.float32), (torch.float32, torch.float16), (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.float8_e5m2),
    ]),
    seed=st.integers(0, 2**16),
)
def test_prompts_with_and_without_cached_context_attend_as_the_oracle_in_every_dtype(
    decode_lens, prefills, dtypes, seed
):
    """The CPU backend's prompt rows, fresh prompts and chunks over cached context alike, through the paged kernel
    (on AMX tiles for bf16 queries where the CPU has them), against the oracle over the same rounded cache."""
    compute_dtype, cache_dtype = dtypes
    generator = torch.Generator().manual_seed(seed)
    batch = mixed_batch(decode_lens, prefills, generator)
    num_tokens = len(batch.slot_mapping)
    q = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator).to(compute_dtype)
    k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator).to(compute_dtype) for _ in range(2))
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    caches = [torch.randn(shape, generator=generator).to(cache_dtype) for _ in range(2)]
    expected = attend(TorchAttention(DEVICE), batch, q, k, v, caches).float()
    out = attend(backends()[0], batch, q, k, v, caches).float()
    assert float((out - expected).abs().max()) < (1e-4 if compute_dtype == torch.float32 else 2e-2)


def test_the_plan_names_amx_tiles_for_prompts_only_where_the_process_may_use_them():
    compiled = cpu.load()
    backend = CpuAttention(DEVICE, compiled)
    assert ("AMX" in backend.prompt_attention) == compiled.amx_linear_usable()


class TilesRecorder:
    """The compiled module, recording the tiles argument of each prompt-attention call."""

    def __init__(self, compiled) -> None:
        self.compiled, self.tiles = compiled, []

    def __getattr__(self, name: str):
        return getattr(self.compiled, name)

    def paged_prefill_attention(self, *args):
        self.tiles.append(args[-1])
        return self.compiled.paged_prefill_attention(*args)


@pytest.mark.parametrize(("backend_cls", "expected"), [
    (CpuAttention, [False, False, True, True]), (BatchInvariantCpuAttention, [False] * 4),
])
def test_prompt_steps_take_the_tiles_from_sixteen_new_tokens_and_never_batch_invariant(backend_cls, expected):
    """A step takes the AMX tiles when one of its sequences brings 16 new tokens or more (speculation's
    verification steps, 5 a sequence, do not); the batch-invariant backend never does. Each step still attends as
    the oracle."""
    steps = [[(30, 5)], [(30, 5), (0, 15)], [(30, 5), (0, 16)], [(0, 40)]]
    recorder = TilesRecorder(cpu.load())
    backend = backend_cls(DEVICE, recorder)
    for number, prefills in enumerate(steps):
        generator = torch.Generator().manual_seed(number)
        batch = mixed_batch([9], prefills, generator)
        num_tokens = len(batch.slot_mapping)
        q = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=generator).bfloat16()
        k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, generator=generator).bfloat16() for _ in range(2))
        shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        caches = [torch.randn(shape, generator=generator).bfloat16() for _ in range(2)]
        expected_out = attend(TorchAttention(DEVICE), batch, q, k, v, caches).float()
        assert float((attend(backend, batch, q, k, v, caches).float() - expected_out).abs().max()) < 2e-2
    assert recorder.tiles == expected


def test_metadata_carries_the_host_sizes_the_kernels_would_otherwise_sync_for():
    batch = mixed_batch([5, 33], [(0, 7), (20, 12)], torch.Generator().manual_seed(0))
    meta = TorchAttention(DEVICE).prepare(batch)
    assert meta.num_decode_tokens == 2 and meta.decode_max_seq_len == 33
    assert meta.prefill_query_starts == [0, 7, 19] and meta.prefill_context_lens == [7, 32]
    assert meta.prefill_max_query_len == 12
    assert meta.prefill_cu_seqlens_q.tolist() == [0, 7, 19]
    assert meta.decode_block_tables.shape == (2, 3) and meta.prefill_block_tables.shape == (2, 2)


@pytest.mark.parametrize("backend_cls", [TorchAttention, TritonAttention])
def test_an_empty_side_of_the_step_is_left_alone(backend_cls):
    batch = mixed_batch([9, 17], [], torch.Generator().manual_seed(1))
    backend = backend_cls(DEVICE)
    meta = backend.prepare(batch)
    assert meta.prefill_block_tables.shape[0] == 0 and meta.prefill_max_query_len == 0
    caches = [torch.zeros(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM) for _ in range(2)]
    q = torch.randn(2, HEADS, HEAD_DIM)
    k = v = torch.randn(2, KV_HEADS, HEAD_DIM)
    assert backend.forward(q, k, v, (caches[0], caches[1]), meta, 0.125).shape == q.shape
