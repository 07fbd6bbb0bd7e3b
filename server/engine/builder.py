"""Assembles an engine from an EngineConfig: model files, device, dtype, KV pool, scheduler."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels import cpu
from kernels.backend import backend_name, select_attention_backend, select_layer_ops
from kernels.cpu_variants import chosen_variant
from server.config import EngineConfig
from server.engine.block_manager import BlockManager
from server.engine.engine import LLMEngine
from server.engine.model_runner import ModelRunner, kv_bytes_per_block
from server.engine.scheduler import Scheduler, SchedulerConfig
from server.engine.stats import CacheInfo, EngineInfo
from server.models.config import ModelConfig
from server.models.decoder import DecoderModel
from server.models.layers import Weights
from server.models.linear import fp16_weight_gemm_available, make_linear
from server.models.loader import load_weights, resolve_model_folder
from server.models.registry import build_model
from server.models.tokenizer import Tokenizer

logger = logging.getLogger("vigil.engine")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_KV_CACHE_DTYPES = {**_DTYPES, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
                    "fp8_e5m2": torch.float8_e5m2}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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


def resolve_max_num_batched_tokens(configured: int | None, device: torch.device) -> int:
    """A CPU computes a 2048-token step for seconds, and every running stream waits through it; 512 keeps that
    under about a second at the same throughput."""
    if configured is not None:
        return configured
    return 2048 if device.type == "cuda" else 512


def count_kv_blocks(config: EngineConfig, bytes_per_block: int, device: torch.device) -> int:
    """CPU: ``--kv-cache-memory``. CUDA: what ``--gpu-memory-utilization`` leaves after the weights."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = free - total * (1.0 - config.gpu_memory_utilization)
    else:
        budget = config.kv_cache_memory
    num_blocks = int(budget // bytes_per_block)
    if num_blocks < 1:
        raise ValueError("no room for a single KV block: raise --kv-cache-memory or --gpu-memory-utilization")
    return num_blocks


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


def load_model(
    config: EngineConfig,
    folder: Path,
    model_config: ModelConfig,
    device: torch.device,
    precision: Precision,
    shard: Callable[[Weights], Weights] | None = None,
) -> DecoderModel:
    """The model on ``device``. A tensor-parallel rank gives its share of the model as ``model_config`` and
    ``shard``, which cuts the checkpoint's tensors to that share before they move to the device."""
    weights = load_weights(folder, precision.dtype)
    if shard is not None:
        weights = shard(weights)
    weights = {name: w.to(device) for name, w in weights.items()}
    invariant = config.batch_invariant
    return build_model(
        model_config, weights,
        lambda weight: make_linear(weight, precision.weight_dtype, config.quantization, row_invariant=invariant),
        select_attention_backend(device, invariant), select_layer_ops(device), device, precision.weight_dtype,
    )


def build_engine(config: EngineConfig) -> LLMEngine:
    """The one way to make an engine: load the model (on every tensor-parallel rank), size the KV pool, wire the
    scheduler."""
    folder = resolve_model_folder(config.model, Path(config.cache_dir) if config.cache_dir else None)
    logger.info("loading the model from %s", folder)
    model_config = ModelConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    if config.tensor_parallel_size > 1:
        from server.distributed.driver import start_tensor_parallel

        model, num_blocks = start_tensor_parallel(config, folder, model_config)
        device, precision = model.device, model.precision
    else:
        device = resolve_device(config.device)
        precision = resolve_precision(config, model_config, device)
        model = load_model(config, folder, model_config, device, precision)
        num_blocks = count_kv_blocks(
            config, kv_bytes_per_block(model_config, config.block_size, precision.kv_dtype), device
        )
    max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                        model_config.max_position_embeddings)
    dtype, weight_dtype, kv_dtype = precision.dtype, precision.weight_dtype, precision.kv_dtype
    # A block's K and V over every rank: the pool is one block table wide on each.
    bytes_per_block = kv_bytes_per_block(model_config, config.block_size, kv_dtype)
    cache_info = CacheInfo(
        num_blocks, config.block_size, bytes_per_block, str(device), _dtype_name(kv_dtype)
    )
    attention = model.attention
    cpu_kernels = cpu.variant_name() if device.type == "cpu" else "none"
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB) in %s on %s; compute %s, weights %s; attention backend %s; "
        "CPU kernels %s; tensor parallel size %d",
        num_blocks, config.block_size, cache_info.total_bytes / 2**20, kv_dtype, device, dtype, weight_dtype,
        attention.name, cpu_kernels, config.tensor_parallel_size,
    )
    runner = ModelRunner(model, num_blocks, config.block_size, kv_dtype, device)
    block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    scheduler = Scheduler(
        SchedulerConfig(
            config.max_num_seqs,
            resolve_max_num_batched_tokens(config.max_num_batched_tokens, device),
            config.max_queue_len,
        ),
        block_manager,
    )
    info = EngineInfo(attention.name, _dtype_name(dtype), _dtype_name(weight_dtype), str(device),
                      config.quantization or "none", model.weight_bytes, config.tensor_parallel_size,
                      cpu_kernels)
    return LLMEngine(config, model_config, tokenizer, scheduler, runner, cache_info, info, max_model_len)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
