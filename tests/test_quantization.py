"""Weight-only int8 and int4: the packing round-trips, the C++ kernels match their torch oracle on random shapes,
and on the bundled model int8 costs under 1% of perplexity."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import cpu, reference
from kernels.cpu_variants import executable_variants
from server.models.linear import QuantizedLinear, make_linear
from server.models.quantization import QuantizedWeight, dequantize, quantize, quantize_int4


def span_largest(x: torch.Tensor, group_size: int, span: int) -> torch.Tensor:
    """Each feature's x rounds against the largest magnitude of its span: runs of up to ``span`` features within
    each group of the weights."""
    largest = torch.empty_like(x, dtype=torch.float32)
    for group in range(0, x.shape[1], group_size):
        for first in range(group, group + group_size, span):
            end = min(first + span, group + group_size)
            largest[:, first:end] = x[:, first:end].float().abs().amax(dim=1, keepdim=True)
    return largest


def rounded_magnitudes(weight: QuantizedWeight) -> torch.Tensor:
    """What multiplies x's rounded features in the kernels: each weight, or for int4 its code times its scale (the
    minimums multiply sums of x taken before rounding), which can be far larger than the weight itself."""
    if weight.mins is None:
        return dequantize(weight).abs()
    return dequantize(replace(weight, mins=torch.zeros_like(weight.mins))).abs()


AMX = cpu.load() is not None and cpu.load().amx_linear_usable()


@pytest.fixture(scope="module")
def compiled():
    module = cpu.load()
    assert module is not None, "the C++ kernels must build on this machine (g++ and ninja)"
    return module


@pytest.mark.parametrize(("method", "bound"), [("int8", 1 / 254), ("int4", 1 / 30)])
def test_dequantised_weights_lie_within_half_a_step_of_the_originals(method, bound):
    weight = torch.randn(24, 128, generator=torch.Generator().manual_seed(0))
    error = (dequantize(quantize(weight, method)) - weight).abs()
    # Half a quantisation step: of the row's range (int8, 254 steps) or of the group's (int4, 15 steps).
    scale = weight.abs().amax(dim=1, keepdim=True) if method == "int8" else 2 * weight.abs().max()
    assert bool((error <= bound * scale + 1e-6).all())


def test_int4_reproduces_weights_already_on_a_four_bit_grid_exactly():
    """The bundled model's weights come from a Q4_1 GGUF: each group of 32 already holds 16 levels at most."""
    generator = torch.Generator().manual_seed(1)
    # fp16 scales and minimums, as Q4_1 stores them
    scales = (torch.rand(8, 4, 1, generator=generator) + 0.1).half().float()
    mins = torch.randn(8, 4, 1, generator=generator).half().float()
    codes = torch.randint(0, 16, (8, 4, 32), generator=generator).float()
    codes[..., 0], codes[..., 1] = 0, 15  # each group spans its whole range, as a quantiser leaves it
    weight = (codes * scales + mins).reshape(8, 128)
    assert torch.allclose(dequantize(quantize(weight, "int4")), weight, atol=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 7e4])
def test_int4_refuses_weights_its_fp16_minimums_cannot_hold(bad):
    weight = torch.randn(4, 64)
    weight[2, 40] = bad
    with pytest.raises(ValueError, match="fp16"):
        quantize_int4(weight)


@settings(max_examples=40, deadline=None)
@given(
    method=st.sampled_from(["int8", "int4"]),
    # few rows (up to 8 on AVX2; with AVX-512 in passes of up to 8), AMX tiles (64 and 80 outputs: int4 from 5 rows
    # to 16, int8 from 3 to 64 with 576 and 1088 inputs), AVX2's panels
    rows=st.integers(1, 20),
    outputs=st.sampled_from([4, 12, 64, 80]),
    inputs=st.sampled_from([32, 96, 576, 1088]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_the_cpp_kernels_match_the_torch_oracle(compiled, method, rows, outputs, inputs, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = quantize(torch.randn(outputs, inputs, generator=generator), method)
    x = torch.randn(rows, inputs, generator=generator).to(dtype)
    expected = getattr(reference, f"{method}_linear")(x, *weight.tensors)
    actual = getattr(compiled, f"{method}_linear")(x, *weight.tensors)
    assert actual.dtype == dtype and actual.shape == (rows, outputs)
    error = (actual.float() - expected.float()).abs()
    largest = expected.float().abs().max()
    # A few rows are rounded to 16-bit integers: each feature is off by at most half a step, the largest magnitude of
    # its span / 65534 (/ 65024 where its high byte must fit a signed byte: int4, and int8 on AMX tiles; int4's span
    # is its row, int8's up to 4096 features), and an output by the sum of those times rounded_magnitudes. bf16
    # outputs are rounded besides.
    half_steps = 65024
    largest_of_span = span_largest(x, inputs, inputs if method == "int4" else 4096)
    rounding = (largest_of_span / half_steps) @ rounded_magnitudes(weight).T
    slack = 1e-2 if dtype == torch.bfloat16 else 1e-5
    assert bool((error <= rounding * 1.001 + slack * largest).all()), float((error - rounding).max())


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize(
    ("rows", "outputs", "inputs"),
    [(49, 40, 576), (52, 64, 96), (33, 960, 576), (65, 48, 1536), (65, 960, 576), (100, 64, 1536), (192, 96, 576),
     (200, 576, 96)],
)
def test_many_bf16_rows_match_the_torch_oracle(compiled, method, rows, outputs, inputs):
    """49 rows and more of bf16 x take the weights dequantised to bf16 where the AMX tiles of int4's decode
    batches or int8's integer tiles do not take them (int4 past 64 rows, int8 past 64, outputs not in sixteens);
    fewer, the few-rows kernels in passes.
    With AMX, 65 to 192 rows against outputs in 32s take the strips: 32 outputs a task dequantised into tile A, two
    row groups a pass (65 and 100 rows end in a pass of one, part-filled); else a column pair of 32 outputs at a
    time, transposed into the tiles' layout, over every block of 32 rows (the last part-filled; 40 and 48 outputs
    end in part of a pair). 33 rows of int8 on AMX take the integer tiles, three passes of up to 16 rows, and of
    int4 the bf16 tiles of its decode batches, three row groups; 52 rows of int8 over 96 features (not in the
    integer tiles' 64s) take the strips, two passes, the second's second row group four rows."""
    generator = torch.Generator().manual_seed(rows + outputs)
    weight = quantize(torch.randn(outputs, inputs, generator=generator), method)
    x = torch.randn(rows, inputs, generator=generator).bfloat16()
    expected = getattr(reference, f"{method}_linear")(x.float(), *weight.tensors)
    actual = getattr(compiled, f"{method}_linear")(x, *weight.tensors)
    assert actual.dtype == torch.bfloat16 and actual.shape == (rows, outputs)
    assert bool(((actual.float() - expected).abs() <= 1e-2 * expected.abs().max()).all())


@pytest.mark.parametrize("rows", [4, 5, 8, 9, 12, 16, 17, 32, 33, 48, 64])
@pytest.mark.parametrize(("inputs", "group_size"), [(576, 32), (4224, 64)])
def test_int4_bf16_decode_batches_match_the_torch_oracle(compiled, rows, inputs, group_size):
    """Four to 64 bf16 rows of int4 against outputs in sixteens, as a decode batch of 4-64 streams or a few streams'
    speculative rows sends them: with AMX each block dequantised into a bf16 tile and multiplied by the rows' B tiles
    (16 rows a tile, up to four), the block's scale and minimum in the weights, groups of two blocks sharing theirs."""
    generator = torch.Generator().manual_seed(rows + inputs)
    weight = quantize_int4(torch.randn(48, inputs, generator=generator), group_size)
    x = torch.randn(rows, inputs, generator=generator).bfloat16()
    expected = reference.int4_linear(x.float(), *weight.tensors)
    actual = compiled.int4_linear(x, *weight.tensors)
    assert actual.dtype == torch.bfloat16 and actual.shape == (rows, 48)
    assert bool(((actual.float() - expected).abs() <= 1e-2 * expected.abs().max()).all())


@pytest.mark.skipif(not AMX, reason="no AMX tiles here: 4-64 bf16 rows of int4 take other kernels")
def test_a_bf16_row_of_int4_on_the_tiles_does_not_depend_on_the_rows_beside_it(compiled):
    """Each row is a column of a tile C whose sums run alone: the same bits in a batch of 4 to 64 rows, and wherever
    the row lies in it (four to eight rows on the integer tiles or the vector kernel would round x otherwise)."""
    weight = quantize_int4(torch.randn(64, 1088, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(64, 1088, generator=torch.Generator().manual_seed(6)).bfloat16()
    whole = compiled.int4_linear(x, *weight.tensors)
    for rows in (4, 5, 8, 9, 16, 17, 31, 33, 48, 63):
        assert torch.equal(compiled.int4_linear(x[:rows], *weight.tensors), whole[:rows]), rows
        assert torch.equal(compiled.int4_linear(x[-rows:], *weight.tensors), whole[-rows:]), rows
    order = torch.randperm(64, generator=torch.Generator().manual_seed(7))
    assert torch.equal(compiled.int4_linear(x[order], *weight.tensors), whole[order])


@pytest.mark.skipif(not AMX, reason="no AMX tiles here: 65-192 bf16 rows of int8 and int4 take other kernels")
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_the_strips_give_the_column_pairs_bits(compiled, method):
    """65 to 192 bf16 rows take the weights as tile A (the strips), 193 and more as tile B (the column pairs); each
    output's sums run over the same blocks in the same order, so a row has the same bits either way and whatever
    rows lie beside it."""
    weight = quantize(torch.randn(96, 1088, generator=torch.Generator().manual_seed(8)), method)
    x = torch.randn(193, 1088, generator=torch.Generator().manual_seed(9)).bfloat16()
    whole = getattr(compiled, f"{method}_linear")(x, *weight.tensors)
    for rows in (65, 80, 97, 128, 192):
        assert torch.equal(getattr(compiled, f"{method}_linear")(x[:rows], *weight.tensors), whole[:rows]), rows
        assert torch.equal(getattr(compiled, f"{method}_linear")(x[-rows:], *weight.tensors), whole[-rows:]), rows


@pytest.mark.parametrize("rows", [1, 3, 5, 8, 12, 16])
@pytest.mark.parametrize("outputs", [20, 32])
@pytest.mark.parametrize(("inputs", "group_size"), [(576, 32), (576, 64), (576, 96), (4224, 32)])
def test_int4_groups_and_rows_match_the_torch_oracle(compiled, rows, outputs, inputs, group_size):
    """Groups wider than a block: with three blocks a group, the few-rows path's pairs of blocks straddle groups. On
    AMX tiles (five to 16 rows, outputs in sixteens) a block is a tile multiply, 132 blocks a span of 128 and one of
    4, and rows past eight a second pass with their own B tile."""
    generator = torch.Generator().manual_seed(inputs + group_size + rows + outputs)
    weight = quantize_int4(torch.randn(outputs, inputs, generator=generator), group_size)
    x = torch.randn(rows, inputs, generator=generator)
    x[:, -5] *= 50
    expected = reference.int4_linear(x, *weight.tensors)
    error = (compiled.int4_linear(x, *weight.tensors) - expected).abs()
    rounding = (span_largest(x, inputs, inputs) / 65024) @ rounded_magnitudes(weight).T
    assert bool((error <= rounding * 1.001 + 1e-5 * expected.abs().max()).all())


@pytest.mark.parametrize("rows", [1, 3, 8, 12, 40])
@pytest.mark.parametrize("outputs", [20, 32])
@pytest.mark.parametrize(("inputs", "group_size"), [(4192, 4192), (4160, 2080), (576, 64), (4224, 4224), (4224, 2112)])
def test_int8_spans_and_groups_match_the_torch_oracle(compiled, rows, outputs, inputs, group_size):
    """The few-rows path sums a span of up to 128 blocks in integers: 131 blocks are a span of 128 and one of 3,
    groups of 65 blocks a span each, groups of 2 blocks 288 spans. One feature 50 times the rest rounds only its
    own span coarser. On AMX tiles (three to 64 rows, whole tiles of 16 outputs and of 64 features, groups of whole
    tiles): 132 blocks a span of 128 and one of 4, groups of 66 blocks a span each, groups of 2 blocks; 12 rows two B
    tiles against one A tile, 40 rows three passes, the last with one B tile."""
    generator = torch.Generator().manual_seed(inputs + group_size + rows + outputs)
    codes = torch.randint(-127, 128, (outputs, inputs), generator=generator, dtype=torch.int8)
    scales = torch.rand(outputs, inputs // group_size, generator=generator) / 100
    x = torch.randn(rows, inputs, generator=generator)
    x[:, -5] *= 50
    expected = reference.int8_linear(x, codes, scales)
    error = (compiled.int8_linear(x, codes, scales) - expected).abs()
    rounding = (span_largest(x, group_size, 4096) / 65024) @ reference.dequantize_int8(codes, scales).abs().T
    assert bool((error <= rounding * 1.001 + 1e-5 * expected.abs().max()).all())


def grouped_weight(method: str, outputs: int, inputs: int, group_size: int, generator: torch.Generator):
    """Random weights with a scale (and for int4 a minimum) per group of ``group_size`` features."""
    if method == "int4":
        return quantize_int4(torch.randn(outputs, inputs, generator=generator), group_size)
    codes = torch.randint(-127, 128, (outputs, inputs), generator=generator, dtype=torch.int8)
    return QuantizedWeight("int8", codes, torch.rand(outputs, inputs // group_size, generator=generator) / 100)


@pytest.mark.parametrize("variant", executable_variants(), ids=lambda variant: variant.name)
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_variant_s_rows_match_the_torch_oracle(variant, method, dtype):
    """Each variant takes rows through kernels of its own (a decode step's one to eight, a prompt's more); the tests
    above run only this CPU's best. In ``avx2`` (Zen 3's), a few rows take the 16-bit (int4 at one row: split-byte)
    vector kernels, and from nine rows outputs in sixteens take the 16-bit integer panels: x rounded a block of 32
    features at a time, or a slice of 256 where every slice lies in one of the weights' groups (int8's one scale an
    output: 576 features are two slices and one of 64; groups of 512), six rows a register tile (9, 10, 13 and 128
    rows end in a part-filled one), 32 features one block. In the AVX-512 variants, 9 to 48 rows that no AMX tiles
    take run through the few-rows kernels in passes of up to eight, split evenly (9 rows: five and four; 17: six,
    six and five; 48: six of eight), and 49 take the path past them. One feature 50 times the rest rounds only its
    own span coarser."""
    compiled = cpu.load_variant(variant)
    assert compiled is not None, f"the {variant.name} kernels must be built at install"
    cases = [(1, 48, 576, 32), (2, 64, 1088, 1088), (5, 32, 576, 64), (8, 48, 1024, 512), (9, 48, 1088, 32),
             (13, 64, 576, 576), (128, 32, 576, 64), (10, 16, 1024, 512), (12, 16, 32, 32), (12, 20, 96, 32),
             (17, 48, 576, 32), (48, 32, 1088, 64), (49, 16, 576, 576)]
    for rows, outputs, inputs, group_size in cases:
        generator = torch.Generator().manual_seed(rows + outputs + inputs + group_size)
        weight = grouped_weight(method, outputs, inputs, group_size, generator)
        x = torch.randn(rows, inputs, generator=generator)
        x[:, -5] *= 50
        x = x.to(dtype)
        expected = getattr(reference, f"{method}_linear")(x, *weight.tensors).float()
        error = (getattr(compiled, f"{method}_linear")(x, *weight.tensors).float() - expected).abs()
        largest_of_span = span_largest(x, inputs, inputs) if method == "int4" else span_largest(x, group_size, 4096)
        rounding = (largest_of_span / 65024) @ rounded_magnitudes(weight).T
        slack = 1e-2 if dtype == torch.bfloat16 else 1e-5
        assert bool((error <= rounding * 1.001 + slack * expected.abs().max()).all()), (rows, outputs, inputs)


@pytest.mark.parametrize("variant", executable_variants(), ids=lambda variant: variant.name)
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 12])
def test_every_variant_sums_full_scale_int8_spans_within_int32(variant, rows):
    """int8's few rows sum a span of up to 128 blocks in 32-bit integer lanes (span_rows.h). With every code and
    every rounded feature at full scale, a span of 128 blocks brings an AVX2 lane to 99% of 2^31; a row of 264
    blocks summed as one span would wrap on every variant's lanes."""
    compiled = cpu.load_variant(variant)
    assert compiled is not None, f"the {variant.name} kernels must be built at install"
    weight = quantize(torch.full((16, 8448), 0.5), "int8")
    x = torch.ones(rows, 8448)
    x[1::2] = -1
    y = compiled.int8_linear(x, *weight.tensors)
    assert torch.allclose(y, 0.5 * x.sum(dim=1, keepdim=True).expand(rows, 16), rtol=1e-4)


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize(("rows", "dtype"), [(2, torch.float32), (3, torch.float32), (5, torch.float32),
                                             (12, torch.float32), (12, torch.bfloat16), (40, torch.bfloat16)])
def test_a_non_finite_input_makes_every_output_non_finite(compiled, method, bad, rows, dtype):
    """As in the oracle: the few-rows path's rounding to integers must not turn a NaN or an infinity into a number,
    nor spill into the other rows (where the CPU has AMX, three rows of int8 and five of int4 share tiles, rows
    past eight a second B tile, and bf16 rows of int4 from four a column of tile C each)."""
    weight = quantize(torch.randn(64, 576, generator=torch.Generator().manual_seed(2)), method)
    x = torch.randn(rows, 576).to(dtype)
    x[1, 100] = bad
    y = getattr(compiled, f"{method}_linear")(x, *weight.tensors)
    finite = y.isfinite()
    assert bool(finite[0].all()) and not bool(finite[1].any()) and bool(finite[2:].all())


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_rows_give_no_outputs(compiled, method, dtype):
    """The row kernels take one row at least: an empty x once crashed the process."""
    weight = quantize(torch.randn(64, 96), method)
    y = getattr(compiled, f"{method}_linear")(torch.randn(0, 96).to(dtype), *weight.tensors)
    assert y.shape == (0, 64) and y.dtype == dtype


def test_shapes_the_cpp_kernel_cannot_take_run_on_the_oracle():
    layer = make_linear(torch.randn(6, 40), torch.float32, "int8")  # 6 outputs: not in fours; 40: not in 32s
    assert isinstance(layer, QuantizedLinear) and layer.kernel is reference.int8_linear
    x = torch.randn(3, 40)
    assert torch.allclose(layer(x), reference.int8_linear(x, *layer.weight.tensors))


@pytest.mark.slow
def test_int8_costs_the_bundled_model_under_one_percent_of_perplexity(smollm_folder):
    from server import LLM
    from server.bench.perplexity import text_perplexity

    def measured(**kwargs) -> float:
        return text_perplexity(LLM(model=str(smollm_folder), dtype="float32", kv_cache_memory=32 * 2**20,
                                   **kwargs).engine)

    baseline = measured()
    int8 = measured(quantization="int8")
    assert 3 < baseline < 50  # a sane model on plain English
    assert abs(int8 - baseline) / baseline < 0.01, (int8, baseline)
