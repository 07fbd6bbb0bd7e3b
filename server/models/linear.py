"""The model's matrix products, with the weight matrices stored in the compute dtype, on the CPU in fp16, or
quantised to int8 or int4 (``--quantization``).

fbgemm's fp16-weight GEMM widens each fp16 weight to fp32 in registers and multiplies and sums in fp32. It is
the same arithmetic as an fp32 GEMM over the fp16-rounded weights, and it runs about twice as fast as MKL's
fp32 GEMM on the skinny shapes of decoding (batch 64: 130-150 against 65-90 GFLOP/s on two AVX2 cores).
"""

from collections.abc import Callable
from types import ModuleType
from typing import Protocol

import torch
import torch.nn.functional as F

from kernels import cpu, huge_pages, reference
from server.models.quantization import QuantizedWeight, quantize


class Linear(Protocol):
    nbytes: int  # what the layer keeps of its weights
    kernel_name: str  # what multiplies, as the execution plan names it

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x's rows as the one contiguous [tokens, features] matrix that the CPU kernels take."""
    return x.reshape(-1, x.shape[-1]).contiguous()


class DenseLinear:
    kernel_name = "torch"

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight
        self.nbytes = weight.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Bf16WeightLinear(DenseLinear):
    """bf16 weights on the CPU: up to ``max_rows`` rows (decoding a few sequences, or one with its speculative
    guesses) go to the C++ kernel, which reads each weight once straight into registers; oneDNN's bf16 GEMM, which
    wins above that, reached about half the machine's read bandwidth at one row."""

    def __init__(
        self, weight: torch.Tensor, few_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], max_rows: int
    ) -> None:
        super().__init__(huge_pages.copy(weight))
        self.few_rows = few_rows
        self.max_rows = max_rows
        self.kernel_name = f"bf16-few-rows-cpp<={max_rows}+onednn"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x)
        if rows.shape[0] > self.max_rows:
            return self.many_rows(x)
        out = self.few_rows(rows, self.weight)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def many_rows(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class RowInvariantBf16Linear(DenseLinear):
    """bf16 weights on the CPU, every row summed in one fixed order by the few-rows kernel, eight rows a pass: a
    row's result is the same bits alone or among 63 others (batch-invariant mode). Above eight rows it reads the
    weights once per eight, so it is slower than oneDNN's GEMM at batch."""

    def __init__(self, weight: torch.Tensor, row_invariant_linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                 ) -> None:
        super().__init__(huge_pages.copy(weight))
        self.row_invariant_linear = row_invariant_linear
        self.kernel_name = "bf16-row-invariant-cpp"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.row_invariant_linear(_rows(x), self.weight)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class AmxBf16WeightLinear:
    """bf16 weights on CPUs with AMX, packed once at load into the tile layout of kernels/csrc/amx_linear.cpp and
    kept only so: more rows than ``max_rows`` take its AMX kernel, fewer its few-rows kernel over the same layout.
    SmolLM2's linears at 64 rows on two Xeon cores, streaming from memory: about 0.75-0.8x the time of oneDNN's
    bf16 GEMM over weights it had packed itself, and it wins from 8 rows to 512; from four rows, where a decode
    batch's rows fill one tile, it also beats the few-rows kernel, which serves one to three rows."""

    def __init__(self, weight: torch.Tensor, compiled: ModuleType) -> None:
        self.out_features = weight.shape[0]
        self.nbytes = weight.nbytes
        self.packed = huge_pages.copy(compiled.amx_pack_weight(weight))
        self.max_rows = compiled.few_rows_limit()
        self.amx_few_rows_linear = compiled.amx_few_rows_linear
        self.amx_linear = compiled.amx_linear
        self.amx_silu_mul_linear = compiled.amx_silu_mul_linear
        self.kernel_name = f"amx-bf16-cpp(few-rows<={self.max_rows})"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x)
        kernel = self.amx_few_rows_linear if rows.shape[0] <= self.max_rows else self.amx_linear
        out = kernel(rows, self.packed, self.out_features)
        return out.reshape(*x.shape[:-1], self.out_features)


class RowInvariantAmxBf16Linear(AmxBf16WeightLinear):
    """bf16 weights in the tile layout with every row count on the AMX kernel, never the few-rows one: the tiles sum
    a row the same way in one tile, in tiles shaped to its batch and in 32-row blocks, so a row's result is the same
    bits alone or among 63 others (batch-invariant mode). SmolLM2's layers on two Xeon cores: 0.91x the time of the
    row-invariant few-rows kernel at one row, 0.65x at eight, 0.20x at 64."""

    def __init__(self, weight: torch.Tensor, compiled: ModuleType) -> None:
        super().__init__(weight, compiled)
        self.max_rows = 0
        self.kernel_name = "amx-bf16-cpp(row-invariant)"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.amx_linear(_rows(x), self.packed, self.out_features).reshape(*x.shape[:-1], self.out_features)


class SiluMulOfGateUp:
    """SiLU(gate) * up of a gate/up layer with AMX weights (gate's rows stacked on up's). Above the few-rows
    kernel's rows one AMX kernel applies the activation to the sums it has just made, with the silu_mul layer op's
    arithmetic, instead of writing the [rows, 2 x intermediate] product out for the layer op to read back: the
    same values, in 0.90x the time of the two steps over SmolLM2's gate/up layers at 64 rows (0.96x at 512).
    Fewer rows take the layer and then the layer op."""

    def __init__(self, gate_up: AmxBf16WeightLinear, silu_mul: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.gate_up = gate_up
        self.silu_mul = silu_mul
        self.intermediate = gate_up.out_features // 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = _rows(x)
        if rows.shape[0] <= self.gate_up.max_rows:
            return self.silu_mul(self.gate_up(x))
        out = self.gate_up.amx_silu_mul_linear(rows, self.gate_up.packed, self.intermediate)
        return out.reshape(*x.shape[:-1], self.intermediate)


def silu_mul_fuses_into(gate_up: Linear) -> bool:
    """Whether SiluMulOfGateUp can take this gate/up layer: AMX weights, each half a whole number of the
    kernel's 32-output column pairs."""
    return isinstance(gate_up, AmxBf16WeightLinear) and gate_up.out_features % 64 == 0


class Fp16WeightLinear:
    """fp32 activations times fp16 weights prepacked for fbgemm; the fp32 copy of the weights is not kept."""

    kernel_name = "fbgemm-fp16"

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        self.out_features = weight.shape[0]
        self.nbytes = weight.numel() * torch.float16.itemsize

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)


class QuantizedLinear:
    """Activations in the compute dtype times weights kept quantised (server/models/quantization.py): the Triton
    kernels on CUDA, the C++ kernels on the CPU, the torch oracle elsewhere."""

    def __init__(self, weight: QuantizedWeight, kernel: Callable[..., torch.Tensor], kernel_name: str) -> None:
        self.weight = weight
        self.kernel = kernel
        self.kernel_name = kernel_name
        self.nbytes = weight.nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.kernel(_rows(x), *self.weight.tensors)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class ChunkedLinear:
    """A wide layer (the output layer) computed in slices of its output features. On the CPU each slice's
    output stays in cache while it is written: for 64 tokens x 49152 features, 32 ms against 50 ms whole.
    Each feature's sum is the same, so the result is too. ``whole``, where given, is the same layer unsliced,
    which serves up to ``WHOLE_UP_TO_ROWS`` rows: there the output is small, and a slice's parallel region and
    the concatenation are what cost."""

    def __init__(self, parts: list[Linear], whole: Linear | None = None) -> None:
        self.parts = parts
        self.whole = whole
        self.nbytes = whole.nbytes if whole is not None else sum(part.nbytes for part in parts)
        up_to = f", whole up to {WHOLE_UP_TO_ROWS} rows" if whole is not None else ""
        self.kernel_name = f"{parts[0].kernel_name} in {len(parts)} slices{up_to}"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.whole is not None and x.numel() <= WHOLE_UP_TO_ROWS * x.shape[-1]:
            return self.whole(x)
        return torch.cat([part(x) for part in self.parts], dim=-1)


# Output features above which a CPU layer is sliced, and the slice height.
CHUNKED_OUTPUT_FEATURES = 16384
OUTPUT_CHUNK = 4096
# Rows up to which a quantised output layer runs whole: the int8 and int4 few-rows kernels' limit on AVX2. On two
# Zen 3 cores SmolLM2's (49152 x 576) took 0.72-0.77x the sliced time at one row, 0.77-0.91x at 2-8; the AVX-512
# variants, whose few-rows kernels stop at 3 rows, were not measured.
WHOLE_UP_TO_ROWS = 8


def fp16_weight_gemm_available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines


def make_linear(
    weight: torch.Tensor, weight_dtype: torch.dtype, quantization: str | None = None, row_invariant: bool = False
) -> Linear:
    """``weight_dtype`` is the compute dtype, or float16 under float32 compute on the CPU; ``quantization`` (int8
    or int4) stores the weights quantised instead. ``row_invariant`` (batch-invariant mode) takes only kernels
    whose result for a row does not depend on the other rows: for bf16 the AMX tiles where they run, else the
    few-rows kernel's fixed order; fbgemm for fp16 weights (which sums a row alike at any row count); raises
    ValueError where there is none."""
    whole = _amx_kernels(weight, weight_dtype) is not None
    if weight.device.type == "cpu" and weight.shape[0] > CHUNKED_OUTPUT_FEATURES and not whole:
        if quantization is not None and not row_invariant:
            return _sliced_quantized_linear(weight, quantization)
        parts = weight.split(OUTPUT_CHUNK)
        return ChunkedLinear([_single_linear(part, weight_dtype, quantization, row_invariant) for part in parts])
    return _single_linear(weight, weight_dtype, quantization, row_invariant)


def _sliced_quantized_linear(weight: torch.Tensor, method: str) -> ChunkedLinear:
    """One quantised layer, whole for few rows, and its slices as views of its rows: no second copy."""
    whole = _quantized_linear(weight, method)
    slices = zip(*(tensor.split(OUTPUT_CHUNK) for tensor in whole.weight.tensors), strict=True)
    parts = [QuantizedLinear(QuantizedWeight(method, *views), whole.kernel, whole.kernel_name) for views in slices]
    return ChunkedLinear(parts, whole)


def _quantized_linear(weight: torch.Tensor, method: str) -> QuantizedLinear:
    """With the Triton kernel on CUDA (any shape quantize() makes); the C++ kernel where it runs (the CPU, output
    features in fours, input features in blocks of 32); else the torch oracle."""
    if weight.device.type == "cuda":
        from kernels import quantized_linear

        return QuantizedLinear(quantize(weight, method), getattr(quantized_linear, f"{method}_linear"),
                               f"{method}-triton")  # fmt: skip
    fits = weight.shape[0] % 4 == 0 and weight.shape[1] % 32 == 0
    compiled = cpu.load() if weight.device.type == "cpu" and fits else None
    source, name = (compiled, "cpp") if compiled is not None else (reference, "torch")
    quantized = quantize(weight, method)
    if weight.device.type == "cpu":
        quantized = QuantizedWeight(method, *(huge_pages.copy(tensor) for tensor in quantized.tensors))
    return QuantizedLinear(quantized, getattr(source, f"{method}_linear"), f"{method}-{name}")


def _few_rows_kernels(weight: torch.Tensor) -> ModuleType | None:
    """The compiled CPU kernels where bf16 weights can take the few-rows kernel."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or weight.shape[1] % 32:
        return None
    return cpu.load()


def _amx_kernels(weight: torch.Tensor, weight_dtype: torch.dtype) -> ModuleType | None:
    """The compiled CPU kernels where a bf16 layer takes the AMX kernel. The output layer then stays whole: in
    4096-row slices it took 1.19-1.27x as long at 16 and 64 rows. So does a quantised one over bf16 x, whose kernels
    there take AMX tiles too: SmolLM2's int8 output layer whole took 0.55-0.75x the sliced time at 8 to 64 rows and
    0.88-0.91x at 128 and 256, int4's 0.73-0.91x (0.98x and 1.07x at 512 rows)."""
    compiled = _few_rows_kernels(weight) if weight.dtype == weight_dtype else None
    return compiled if compiled is not None and compiled.amx_linear_usable() else None


def _single_linear(
    weight: torch.Tensor, weight_dtype: torch.dtype, quantization: str | None, row_invariant: bool
) -> Linear:
    if row_invariant:
        return _row_invariant_linear(weight, weight_dtype, quantization)
    if quantization is not None:
        return _quantized_linear(weight, quantization)
    if weight_dtype == weight.dtype:
        compiled = _few_rows_kernels(weight)
        if compiled is None:
            return DenseLinear(weight)
        if compiled.amx_linear_usable():
            return AmxBf16WeightLinear(weight, compiled)
        return Bf16WeightLinear(weight, compiled.few_rows_linear, compiled.few_rows_limit())
    if weight_dtype == torch.float16 and weight.dtype == torch.float32 and weight.device.type == "cpu":
        return Fp16WeightLinear(weight)
    raise ValueError(f"weights in {weight_dtype} under {weight.dtype} compute on {weight.device} are not supported")


def _row_invariant_linear(weight: torch.Tensor, weight_dtype: torch.dtype, quantization: str | None) -> Linear:
    if quantization is None and weight_dtype == weight.dtype == torch.bfloat16:
        compiled = _few_rows_kernels(weight)
        if compiled is not None and compiled.amx_linear_usable():
            return RowInvariantAmxBf16Linear(weight, compiled)
        if compiled is not None:
            return RowInvariantBf16Linear(weight, compiled.row_invariant_linear)
    fp16_weights = weight_dtype == torch.float16 and weight.dtype == torch.float32 and weight.device.type == "cpu"
    if quantization is None and fp16_weights and fp16_weight_gemm_available():
        return Fp16WeightLinear(weight)
    raise ValueError(
        "batch-invariant mode needs the compiled CPU kernels and bf16 compute, or fp32 compute over fp16 weights, "
        f"with no quantization; this model has {weight.dtype} compute, {weight_dtype} weights"
        + (f" and {quantization} quantization" if quantization else "") + f" on {weight.device}"
    )
