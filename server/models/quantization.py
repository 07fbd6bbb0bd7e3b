"""Weight-only quantisation, done at load time from any checkpoint (vLLM's ``--quantization``).

- ``int8``: one symmetric scale per output channel; weights are round(w / scale) in [-127, 127].
- ``int4``: a scale and a minimum per group of 32 input features, both fp16 as in Q4_1 (fp32 ones made the
  weights 0.75 bytes each, not 0.625, and the kernels read them every step); weights are codes in [0, 15] standing for
  code * scale + min, two per byte in llama.cpp's Q4_1 block layout (byte i of a 32-feature block: feature i
  low, feature i + 16 high). The minimum matters: a symmetric grid of 16 levels wastes one side of it on every
  group whose weights lean one way.

Activations stay in the compute dtype; the kernels dequantise in registers (kernels/csrc/quantized_linear.cpp,
with the torch versions in kernels/reference.py as their oracle).
"""

from dataclasses import dataclass

import torch

from kernels import reference
from server.config import QUANTIZATIONS

INT4_GROUP_SIZE = 32


@dataclass(frozen=True)
class QuantizedWeight:
    """``data`` is int8 ``[N, K]`` with fp32 ``scales`` ``[N, 1]``, or uint8 ``[N, K / 2]`` with fp16 ``scales``
    and ``mins`` ``[N, groups]``. ``tensors`` are what the kernels take after the activations."""

    method: str
    data: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.data, self.scales) if self.mins is None else (self.data, self.scales, self.mins)

    @property
    def nbytes(self) -> int:
        return sum(tensor.nbytes for tensor in self.tensors)


def quantize(weight: torch.Tensor, method: str) -> QuantizedWeight:
    if method == "int8":
        return quantize_int8(weight)
    if method == "int4":
        return quantize_int4(weight)
    raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, not {method!r}")


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    w = weight.float()
    scales = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    data = (w / scales).round().clamp(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", data.contiguous(), scales.contiguous())


def quantize_int4(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> QuantizedWeight:
    n, k = weight.shape
    if k % group_size or group_size % 32:
        raise ValueError(f"int4 needs input features in groups of a multiple of 32, not {k} in groups of {group_size}")
    groups = weight.float().reshape(n, k // group_size, group_size)
    low, high = groups.amin(dim=2, keepdim=True), groups.amax(dim=2, keepdim=True)
    # A NaN anywhere makes its group's extremes NaN, and the comparison false.
    if not bool(torch.maximum(-low, high).amax() <= torch.finfo(torch.float16).max):
        raise ValueError("int4 keeps its minimums in fp16: weights must be finite and within ±65504")
    # The codes are chosen against the fp16 scale and minimum the kernels will read.
    low = low.half()
    scales = ((high - low.float()) / 15).clamp(min=torch.finfo(torch.float16).smallest_normal).half()
    codes = ((groups - low.float()) / scales.float()).round().clamp(0, 15).to(torch.uint8).reshape(n, k // 32, 2, 16)
    packed = codes[:, :, 0, :] | (codes[:, :, 1, :] << 4)
    return QuantizedWeight(
        "int4", packed.reshape(n, k // 2).contiguous(), scales.reshape(n, -1).contiguous(),
        low.reshape(n, -1).contiguous(),
    )


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The fp32 ``[N, K]`` matrix that the quantised one stands for."""
    unpack = reference.dequantize_int8 if weight.method == "int8" else reference.dequantize_int4
    return unpack(*weight.tensors)
