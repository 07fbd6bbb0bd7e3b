"""The compiled CPU decode kernel against the torch oracle, on random paged layouts."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cpu, reference
from kernels.backend import select_attention_ops


@pytest.fixture(scope="module")
def compiled():
    module = cpu.load()
    assert module is not None, "the C++ decode kernel must build on this machine (g++ and ninja)"
    return module


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([8, 16, 32]),
    head_dim=st.sampled_from([64, 128]),
    kv_heads=st.sampled_from([1, 2, 3]),
    group=st.sampled_from([1, 3, 4]),
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=5),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_decode_matches_the_reference(compiled, block_size, head_dim, kv_heads, group, lengths, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    widths = [-(-n // block_size) for n in lengths]
    num_blocks = sum(widths) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=generator).to(dtype)
    order = torch.randperm(num_blocks, generator=generator).tolist()
    tables = torch.zeros(len(lengths), max(widths), dtype=torch.int32)
    for row, width in enumerate(widths):
        tables[row, :width] = torch.tensor([order.pop() for _ in range(width)])
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(len(lengths), kv_heads * group, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5
    expected = reference.paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, scale)
    actual = compiled.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale)
    assert actual.dtype == dtype and actual.shape == q.shape
    relative = (actual.float() - expected).abs().max() / expected.abs().max()
    assert relative < (1e-5 if dtype == torch.float32 else 1e-2)


def test_cpu_tensors_take_the_compiled_kernel_by_default(compiled, monkeypatch):
    monkeypatch.delenv("VIGIL_ATTENTION_BACKEND", raising=False)
    ops = select_attention_ops(torch.device("cpu"))
    assert ops.name == "cpu" and ops.paged_decode_attention is compiled.paged_decode_attention
    monkeypatch.setenv("VIGIL_ATTENTION_BACKEND", "torch")
    assert select_attention_ops(torch.device("cpu")).paged_decode_attention is reference.paged_decode_attention
    monkeypatch.setenv("VIGIL_ATTENTION_BACKEND", "cuda-magic")
    with pytest.raises(ValueError, match="VIGIL_ATTENTION_BACKEND"):
        select_attention_ops(torch.device("cpu"))
