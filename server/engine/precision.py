"""The dtypes an engine computes in, keeps its weight matrices in and keeps K/V in, resolved from the flags, the
checkpoint and what the device does fast; and the device itself."""

from dataclasses import dataclass

import torch

from kernels.backend import backend_name
from kernels.cpu_variants import chosen_variant
from server.config import EngineConfig
from server.models.config import ModelConfig
from server.models.linear import fp16_weight_gemm_available


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_KV_CACHE_DTYPES = {**_DTYPES, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                    "fp8_e5m2": torch.float8_e5m2}


def cpu_has_fast_bf16() -> bool:
    """AVX512-BF16 (which every CPU with AMX has) in the kernel variant this CPU runs: without it, bf16 matmuls on
    the CPU are emulated and slower than fp32."""
    variant = chosen_variant()
    return variant is not None and "avx512_bf16" in variant.cpu_flags


def resolve_dtype(name: str, model_config: ModelConfig, device: torch.device) -> torch.dtype:
    """``auto`` takes the checkpoint's dtype, except that the CPU computes half precision in bf16 where it has
    bf16 instructions and in fp32 where it has not."""
    if name != "auto":
        return _DTYPES[name]
    dtype = _DTYPES.get(model_config.torch_dtype.removeprefix("torch."), torch.float32)
    if device.type == "cpu" and dtype != torch.float32:
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    return dtype


def resolve_weight_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` stores weights in fp16 where the CPU computes in fp32 and fbgemm is there, else in ``dtype``."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu" and dtype == torch.float32 and fp16_weight_gemm_available():
        return torch.float16
    return dtype


def resolve_kv_cache_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` keeps K/V in fp16 where the CPU computes in fp32, as llama.cpp does by default: twice the tokens in
    the same memory, and half the bytes that memory-bound decode attention reads. Elsewhere, ``dtype``. fp8 caches
    are the CPU kernels' (and the torch path's) alone."""
    if name.startswith("fp8") and backend_name(device) == "triton":
        raise ValueError(f"--kv-cache-dtype {name}: fp8 caches are read by the CPU kernels only, not by Triton")
    if name != "auto":
        return _KV_CACHE_DTYPES[name]
    return torch.float16 if device.type == "cpu" and dtype == torch.float32 else dtype


@dataclass(frozen=True)
class Precision:
    """The dtypes an engine computes in, keeps its weight matrices in and keeps K/V in."""

    dtype: torch.dtype
    weight_dtype: torch.dtype
    kv_dtype: torch.dtype


def resolve_precision(config: EngineConfig, model_config: ModelConfig, device: torch.device) -> Precision:
    dtype = resolve_dtype(config.dtype, model_config, device)
    return Precision(
        dtype,
        resolve_weight_dtype(config.weight_dtype, dtype, device),
        resolve_kv_cache_dtype(config.kv_cache_dtype, dtype, device),
    )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
