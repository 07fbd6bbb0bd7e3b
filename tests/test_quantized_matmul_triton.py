"""The Triton int8 and int4 linear kernels against their torch oracle (run by the Triton interpreter on the CPU).

Relative error is ``max |out - ref| / max |ref|``. Under the interpreter the kernels multiply in fp32, as the oracle
does, so the two differ by the order of fp32 sums and then by rounding the same sums to the output dtype: at most
one unit in the last place of the largest output, which is the dtype's eps relative to it.
"""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import quantized_linear, reference
from server.models.linear import QuantizedLinear, make_linear
from server.models.quantization import quantize, quantize_int4

TOLERANCE = {
    torch.float32: 1e-5,
    torch.float16: 2 * torch.finfo(torch.float16).eps,
    torch.bfloat16: 2 * torch.finfo(torch.bfloat16).eps,
}


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.float() - expected.float()).abs().max() / expected.float().abs().max())


# target_programs 1 runs every K tile in one program (prefill's shapes); 2 and 128 split K unevenly and by tile.
@settings(max_examples=50, deadline=None)
@given(
    method=st.sampled_from(["int8", "int4"]),
    rows=st.integers(1, 40),
    outputs=st.sampled_from([4, 64, 196]),
    inputs=st.sampled_from([32, 64, 160, 288]),
    dtype=st.sampled_from(list(TOLERANCE)),
    target_programs=st.sampled_from([1, 2, 128]),
    seed=st.integers(0, 2**16),
)
def test_the_triton_kernels_match_the_torch_oracle(method, rows, outputs, inputs, dtype, target_programs, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = quantize(torch.randn(outputs, inputs, generator=generator), method)
    x = torch.randn(rows, inputs, generator=generator).to(dtype)
    with mock.patch.object(quantized_linear, "_TARGET_PROGRAMS", target_programs):
        actual = getattr(quantized_linear, f"{method}_linear")(x, *weight.tensors)
    expected = getattr(reference, f"{method}_linear")(x, *weight.tensors)
    assert actual.dtype == dtype and actual.shape == (rows, outputs)
    assert relative_error(actual, expected) <= TOLERANCE[dtype]


def test_int4_groups_wider_than_a_block_and_rows_with_a_stride():
    generator = torch.Generator().manual_seed(2)
    weight = quantize_int4(torch.randn(20, 256, generator=generator), group_size=64)
    x = torch.randn(7, 300, generator=generator)[:, :256]
    expected = reference.int4_linear(x, *weight.tensors)
    assert relative_error(quantized_linear.int4_linear(x, *weight.tensors), expected) <= TOLERANCE[torch.float32]


def test_no_rows_give_an_empty_product():
    weight = quantize(torch.randn(8, 64), "int8")
    assert quantized_linear.int8_linear(torch.empty(0, 64), *weight.tensors).shape == (0, 8)


def test_formats_the_kernels_do_not_take_are_refused():
    x = torch.randn(2, 64)
    int8, int4 = quantize(torch.randn(8, 64), "int8"), quantize(torch.randn(8, 64), "int4")
    with pytest.raises(ValueError, match="one per output channel"):
        quantized_linear.int8_linear(x, int8.data, int8.scales.repeat(1, 2))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantized_linear.int4_linear(x, int4.data, int4.scales.repeat(1, 2), int4.mins.repeat(1, 2))
    with pytest.raises(ValueError, match="contiguous rows"):
        quantized_linear.int8_linear(torch.randn(64, 2).T, *int8.tensors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_cuda_layer_runs_the_triton_kernel(method):
    layer = make_linear(torch.randn(64, 96, device="cuda"), torch.float32, method)
    assert isinstance(layer, QuantizedLinear) and layer.kernel is getattr(quantized_linear, f"{method}_linear")
    x = torch.randn(3, 96, device="cuda")
    expected = getattr(reference, f"{method}_linear")(x, *layer.weight.tensors)
    assert relative_error(layer(x), expected) <= 1e-5
