"""The model's matrix products: fp16-stored weights compute fp32 products of the rounded weights, bf16 weights
decoding a few rows on the CPU take the C++ kernel and equal an fp32 product, on AMX CPUs more rows take the tile
kernel over weights packed once and equal it too, and a wide layer computed in slices equals the whole."""

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cpu, reference
from server.models.linear import (
    CHUNKED_OUTPUT_FEATURES,
    WHOLE_UP_TO_ROWS,
    AmxBf16WeightLinear,
    Bf16WeightLinear,
    ChunkedLinear,
    DenseLinear,
    Fp16WeightLinear,
    QuantizedLinear,
    RowInvariantAmxBf16Linear,
    RowInvariantBf16Linear,
    SiluMulOfGateUp,
    make_linear,
    silu_mul_fuses_into,
)

MAX_FEW_ROWS = 8  # the rows of a pass of kernels/csrc/few_rows_linear.cpp, and what the AMX few-rows kernel accepts
FEW_ROWS_ACCEPTED = 32  # what few_rows_linear accepts, in passes; layers use it up to its few_rows_limit()
COMPILED = cpu.load()
AMX = COMPILED is not None and COMPILED.amx_linear_usable()
needs_amx = pytest.mark.skipif(not AMX, reason="no AMX tiles here (or no C++ compiler): bf16 layers take oneDNN's GEMM")


def assert_bf16_product(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """fp32 sums of the bf16 products, rounded once to bf16: half an ulp (2^-8 relative), plus fp32 sums in
    another order."""
    expected = F.linear(x.float(), weight.float())
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    torch.testing.assert_close(out.float(), expected, rtol=2**-8, atol=2**-8 * expected.abs().max().item())


def test_fp16_weights_are_an_fp32_product_of_the_rounded_weights():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator) * 0.1
    x = torch.randn(5, 64, generator=generator)
    layer = make_linear(weight, torch.float16)
    assert isinstance(layer, Fp16WeightLinear)
    expected = F.linear(x, weight.half().float())
    assert layer(x).dtype == torch.float32
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-6)
    assert (layer(x) - F.linear(x, weight)).abs().max() > 0, "the weights were not rounded at all"


def test_wide_cpu_layers_are_sliced_and_equal_the_whole():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(CHUNKED_OUTPUT_FEATURES + 3000, 32, generator=generator)
    x = torch.randn(3, 32, generator=generator)
    for weight_dtype, rounded in ((torch.float32, weight), (torch.float16, weight.half().float())):
        layer = make_linear(weight, weight_dtype)
        assert isinstance(layer, ChunkedLinear) and len(layer.parts) > 1
        torch.testing.assert_close(layer(x), F.linear(x, rounded), rtol=1e-6, atol=1e-5)
    assert isinstance(make_linear(weight[:CHUNKED_OUTPUT_FEATURES], torch.float32), DenseLinear)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, FEW_ROWS_ACCEPTED + 2),
    out_features=st.integers(1, 70),
    blocks=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_bf16_weights_few_rows_equal_an_fp32_product(rows, out_features, blocks, seed):
    """Up to the kernel's limit rows go to the C++ kernel (AVX512-BF16 dot products where the CPU has them, else
    widened to fp32), more to oneDNN; all are fp32 sums of the bf16 products, rounded once to bf16."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, 32 * blocks, generator=generator).bfloat16()
    x = torch.randn(2, rows, 32 * blocks, generator=generator).bfloat16()[1]  # rows of a larger tensor
    layer = make_linear(weight, torch.bfloat16)
    outputs = [layer(x)]
    if COMPILED is not None:
        assert isinstance(layer, (Bf16WeightLinear, AmxBf16WeightLinear)) and 1 <= layer.max_rows <= FEW_ROWS_ACCEPTED
        if rows <= FEW_ROWS_ACCEPTED:  # the kernel itself, also at row counts the layer leaves to a GEMM here
            outputs.append(COMPILED.few_rows_linear(x, weight))
    for out in outputs:
        assert_bf16_product(out, x, weight)


def test_the_few_rows_kernel_refuses_what_it_cannot_take():
    if COMPILED is None:
        pytest.skip("no C++ compiler: the kernels did not build")
    compiled = COMPILED
    weight = torch.randn(8, 64).bfloat16()
    for x, message in ((torch.randn(FEW_ROWS_ACCEPTED + 1, 64).bfloat16(), "1 to 32 rows"),
                       (torch.randn(1, 48).bfloat16(), "x must be [rows, 64]"), (torch.randn(1, 64), "x must be bf16")):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            compiled.few_rows_linear(x, weight)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        compiled.few_rows_linear(torch.randn(1, 48).bfloat16(), torch.randn(8, 48).bfloat16())


@needs_amx
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 100),
    out_features=st.integers(1, 100),
    blocks=st.integers(1, 5),
    spare_columns=st.integers(0, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_amx_kernel_equals_an_fp32_product(rows, out_features, blocks, spare_columns, seed):
    """Any rows (up to 16 in one tile, up to 32 in tiles shaped to them, above that a last block of fewer than 32
    through a zero-padded copy), any outputs (the packed weights are zero past them, up to the next 32), and rows
    of x further apart than its width."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, 32 * blocks, generator=generator).bfloat16()
    x = torch.randn(rows, 32 * blocks + spare_columns, generator=generator).bfloat16()[:, : 32 * blocks]
    packed = COMPILED.amx_pack_weight(weight)
    assert packed.numel() == -(-out_features // 32) * 32 * 32 * blocks
    assert_bf16_product(COMPILED.amx_linear(x, packed, out_features), x, weight)


@needs_amx
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, MAX_FEW_ROWS),
    out_features=st.integers(1, 100),
    blocks=st.integers(1, 5),
    spare_pairs=st.integers(0, 20),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_few_rows_kernel_over_the_tile_layout_equals_an_fp32_product(rows, out_features, blocks, spare_pairs, seed):
    """Decoding a few sequences reads the same packed weights (no plain copy is kept), without tiles."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, 32 * blocks, generator=generator).bfloat16()
    x = torch.randn(rows, 32 * blocks + 2 * spare_pairs, generator=generator).bfloat16()[:, : 32 * blocks]
    packed = COMPILED.amx_pack_weight(weight)
    assert_bf16_product(COMPILED.amx_few_rows_linear(x, packed, out_features), x, weight)
    with pytest.raises(RuntimeError, match="1 to 8 rows"):
        COMPILED.amx_few_rows_linear(torch.randn(MAX_FEW_ROWS + 1, 32 * blocks).bfloat16(), packed, out_features)


@needs_amx
def test_a_row_through_the_amx_kernels_does_not_depend_on_the_rows_beside_it():
    """A decode batch's rows in one tile, tiles shaped to 17-31 rows, and 32-row blocks with a padded last one:
    each row's sums are the same bits whichever way its batch was taken; no rows, no sums (and no crash)."""
    generator = torch.Generator().manual_seed(3)
    weight = (torch.randn(2 * 160, 96, generator=generator) * 0.2).bfloat16()
    packed = COMPILED.amx_pack_weight(weight)
    x = torch.randn(70, 96, generator=generator).bfloat16()
    whole = COMPILED.amx_linear(x, packed, 2 * 160)
    activated = COMPILED.amx_silu_mul_linear(x, packed, 160)
    for rows in (0, 1, 5, 16, 17, 31, 32, 45):
        assert torch.equal(COMPILED.amx_linear(x[:rows], packed, 2 * 160), whole[:rows]), rows
        assert torch.equal(COMPILED.amx_linear(x[-rows:], packed, 2 * 160), whole[-rows:]), rows
        assert torch.equal(COMPILED.amx_silu_mul_linear(x[:rows], packed, 160), activated[:rows]), rows
        assert torch.equal(COMPILED.amx_silu_mul_linear(x[-rows:], packed, 160), activated[-rows:]), rows


@needs_amx
def test_the_amx_kernel_takes_a_prefill_chunk_and_threads_share_the_columns():
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(3072, 576, generator=generator).bfloat16()
    x = torch.randn(512 + 37, 576, generator=generator).bfloat16()
    out = COMPILED.amx_linear(x, COMPILED.amx_pack_weight(weight), 3072)
    assert_bf16_product(out, x, weight)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = COMPILED.amx_linear(x, COMPILED.amx_pack_weight(weight), 3072)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, out), "each output's sum does not depend on which thread computed it"


@needs_amx
def test_the_amx_kernel_refuses_what_it_cannot_take():
    weight = torch.randn(40, 64).bfloat16()
    packed = COMPILED.amx_pack_weight(weight)
    for call, message in (
        (lambda: COMPILED.amx_pack_weight(torch.randn(40, 48).bfloat16()), "multiple of 32"),
        (lambda: COMPILED.amx_pack_weight(torch.randn(40, 64)), "w must be bf16"),
        (lambda: COMPILED.amx_linear(torch.randn(3, 64).bfloat16(), packed, 65), "out_features does not match"),
        (lambda: COMPILED.amx_linear(torch.randn(3, 96).bfloat16(), packed, 40), "x must be bf16 [rows, 64]"),
        (lambda: COMPILED.amx_linear(torch.randn(3, 64), packed, 40), "x must be bf16 [rows, 64]"),
        (lambda: COMPILED.amx_linear(torch.randn(3, 64).bfloat16(), weight, 40), "from amx_pack_weight"),
    ):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            call()


@needs_amx
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 80),
    pairs=st.integers(1, 4),
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_amx_gate_up_kernel_equals_the_product_then_the_silu_mul_op(rows, pairs, blocks, seed):
    """Bit for bit: the fused kernel rounds each sum to bf16 before the activation, as the product stored in bf16
    would be, and shares the layer op's arithmetic."""
    generator = torch.Generator().manual_seed(seed)
    intermediate = 32 * pairs
    weight = (torch.randn(2 * intermediate, 32 * blocks, generator=generator) * 0.2).bfloat16()
    x = torch.randn(rows, 32 * blocks, generator=generator).bfloat16()
    packed = COMPILED.amx_pack_weight(weight)
    fused = COMPILED.amx_silu_mul_linear(x, packed, intermediate)
    assert torch.equal(fused, COMPILED.silu_mul(COMPILED.amx_linear(x, packed, 2 * intermediate)))
    gate, up = F.linear(x.float(), weight.float()).bfloat16().chunk(2, dim=-1)
    torch.testing.assert_close(fused, (F.silu(gate) * up), rtol=2**-7, atol=2**-7 * up.abs().max().item())


@needs_amx
def test_the_amx_gate_up_kernel_refuses_halves_it_cannot_pair():
    packed = COMPILED.amx_pack_weight(torch.randn(96, 64).bfloat16())
    for intermediate in (48, 32, 64):
        with pytest.raises(RuntimeError, match="2 x intermediate outputs, a multiple of 32"):
            COMPILED.amx_silu_mul_linear(torch.randn(3, 64).bfloat16(), packed, intermediate)


@needs_amx
@pytest.mark.parametrize("rows", [1, MAX_FEW_ROWS, 64])
def test_swiglu_of_an_amx_gate_up_layer_is_the_layer_then_the_activation(rows):
    generator = torch.Generator().manual_seed(rows)
    weight = (torch.randn(2 * 96, 64, generator=generator) * 0.2).bfloat16()
    layer = make_linear(weight, torch.bfloat16)
    assert silu_mul_fuses_into(layer) and not silu_mul_fuses_into(make_linear(weight[:160], torch.bfloat16))
    activated = SiluMulOfGateUp(layer, COMPILED.silu_mul)
    x = torch.randn(rows, 96, generator=generator).bfloat16()[:, :64]  # rows further apart than their width
    assert torch.equal(activated(x), COMPILED.silu_mul(layer(x)))


@needs_amx
@pytest.mark.parametrize("rows", [MAX_FEW_ROWS + 1, 17, 64, 130])
def test_bf16_layers_on_amx_take_weights_packed_once_and_equal_an_fp32_product(rows):
    """Above the few-rows kernel's rows, the AMX kernel over weights packed at load; the output layer stays
    whole."""
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(CHUNKED_OUTPUT_FEATURES + 96, 64, generator=generator).bfloat16()
    x = torch.randn(rows, 64, generator=generator).bfloat16()
    layer = make_linear(weight, torch.bfloat16)
    assert isinstance(layer, AmxBf16WeightLinear) and layer.max_rows < MAX_FEW_ROWS
    assert layer.nbytes == weight.nbytes and not hasattr(layer, "weight"), "only the packed copy is kept"
    out = layer(x)
    assert_bf16_product(out, x, weight)
    torch.testing.assert_close(layer(x.unsqueeze(0))[0], out, rtol=0, atol=0)
    quantized = make_linear(weight, torch.bfloat16, "int8")
    assert isinstance(quantized, QuantizedLinear), "a quantised output layer stays whole on AMX too"
    expected = reference.int8_linear(x.float(), *quantized.weight.tensors)
    assert bool(((quantized(x).float() - expected).abs() <= 1e-2 * expected.abs().max()).all())


@needs_amx
def test_batch_invariant_layers_on_amx_take_the_tiles_at_every_row_count_and_a_row_keeps_its_bits():
    """Batch-invariant mode on AMX: one to three rows too go to the tiles (the default takes the few-rows kernel
    there, which sums in another order), the output layer stays whole, and the gate/up layer fuses SwiGLU at every
    row count; a row gives the same bits alone, among others and in a batch of 70."""
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(70, 96, generator=generator).bfloat16()
    gate_up = make_linear((torch.randn(2 * 160, 96, generator=generator) * 0.2).bfloat16(), torch.bfloat16,
                          row_invariant=True)  # fmt: skip
    wide_weight = torch.randn(CHUNKED_OUTPUT_FEATURES + 96, 96, generator=generator).bfloat16()
    wide = make_linear(wide_weight, torch.bfloat16, row_invariant=True)
    assert isinstance(gate_up, RowInvariantAmxBf16Linear) and isinstance(wide, RowInvariantAmxBf16Linear)
    assert silu_mul_fuses_into(gate_up) and "row-invariant" in gate_up.kernel_name
    activated = SiluMulOfGateUp(gate_up, reference.silu_mul)
    whole, whole_activated, whole_wide = gate_up(x), activated(x), wide(x)
    assert_bf16_product(whole_wide, x, wide_weight)
    for rows in (1, 2, 3, 5, 16, 17, 33):
        for first in (0, 70 - rows):
            part = x[first:first + rows]
            assert torch.equal(gate_up(part), whole[first:first + rows]), (rows, first)
            assert torch.equal(activated(part), whole_activated[first:first + rows]), (rows, first)
            assert torch.equal(wide(part), whole_wide[first:first + rows]), (rows, first)
    assert gate_up(x[:0]).shape == (0, 2 * 160)


def test_batch_invariant_bf16_layers_take_the_tiles_with_amx_and_the_row_invariant_kernel_without():
    if COMPILED is None:
        pytest.skip("no C++ compiler: batch-invariant mode has no bf16 kernel")
    layer = make_linear(torch.randn(64, 64).bfloat16(), torch.bfloat16, row_invariant=True)
    assert isinstance(layer, RowInvariantAmxBf16Linear if AMX else RowInvariantBf16Linear)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_wide_quantised_layer_runs_whole_for_few_rows_and_in_slices_of_its_own_rows_above(method):
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(CHUNKED_OUTPUT_FEATURES + 4096, 64, generator=generator) * 0.1
    layer = make_linear(weight, torch.float32, method)
    assert isinstance(layer, ChunkedLinear) and layer.whole is not None and len(layer.parts) > 1
    whole_data = layer.whole.weight.data
    assert all(part.weight.data.untyped_storage().data_ptr() == whole_data.untyped_storage().data_ptr()
               for part in layer.parts), "the slices are views of the whole layer's rows"
    assert layer.nbytes == layer.whole.nbytes
    for rows in (1, WHOLE_UP_TO_ROWS, WHOLE_UP_TO_ROWS + 1, 40):
        x = torch.randn(rows, 64, generator=generator)
        sliced = torch.cat([part(x) for part in layer.parts], dim=-1)
        torch.testing.assert_close(layer(x), sliced, rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(layer(x), layer.whole(x), rtol=1e-6, atol=1e-5)
