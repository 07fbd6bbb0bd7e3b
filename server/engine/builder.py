"""Assembles an engine from an EngineConfig: model files, device, dtype, KV pool, scheduler."""

import logging
from pathlib import Path

import torch

from kernels import cpu
from server.config import EngineConfig
from server.engine.block_manager import BlockManager
from server.engine.engine import LLMEngine
from server.engine.execution_plan import plan_execution
from server.engine.kv_pool import count_kv_blocks, device_memory_in_use, kv_bytes_per_block
from server.engine.model_loading import load_model
from server.engine.model_runner import ModelRunner
from server.engine.precision import dtype_name, resolve_device, resolve_precision
from server.engine.scheduler import Scheduler, SchedulerConfig
from server.engine.stats import CacheInfo, EngineInfo
from server.models.config import ModelConfig
from server.models.loader import resolve_model_folder
from server.models.tokenizer import Tokenizer

logger = logging.getLogger("vigil.engine")


def resolve_max_num_batched_tokens(configured: int | None, device: torch.device) -> int:
    """A CPU computes a 2048-token step for seconds, and every running stream waits through it; 512 keeps that
    under about a second at the same throughput."""
    if configured is not None:
        return configured
    return 2048 if device.type == "cuda" else 512


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
        in_use_before_load = device_memory_in_use(device)
        model = load_model(config, folder, model_config, device, precision)
        num_blocks = count_kv_blocks(
            config, kv_bytes_per_block(model_config, config.block_size, precision.kv_dtype), device,
            in_use_before_load,
        )
    max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                        model_config.max_position_embeddings)
    dtype, weight_dtype, kv_dtype = precision.dtype, precision.weight_dtype, precision.kv_dtype
    # A block's K and V over every rank: the pool is one block table wide on each.
    bytes_per_block = kv_bytes_per_block(model_config, config.block_size, kv_dtype)
    cache_info = CacheInfo(
        num_blocks, config.block_size, bytes_per_block, str(device), dtype_name(kv_dtype)
    )
    cpu_kernels = cpu.variant_name() if device.type == "cpu" else "none"
    plan, one_call = plan_execution(model, config.decode_path, dtype_name(kv_dtype), cpu_kernels,
                                    config.tensor_parallel_size, config.max_num_seqs)
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB) in %s on %s; compute %s, weights %s",
        num_blocks, config.block_size, cache_info.total_bytes / 2**20, kv_dtype, device, dtype, weight_dtype,
    )
    for line in plan.describe():
        logger.info("execution plan: %s", line)
    max_blocks_per_seq = -(-max_model_len // config.block_size)
    runner = ModelRunner(model, plan, one_call, num_blocks, config.block_size, max_blocks_per_seq, kv_dtype, device)
    block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
    scheduler = Scheduler(
        SchedulerConfig(
            config.max_num_seqs,
            resolve_max_num_batched_tokens(config.max_num_batched_tokens, device),
            config.max_queue_len,
        ),
        block_manager,
    )
    info = EngineInfo(plan.attention, dtype_name(dtype), dtype_name(weight_dtype), str(device),
                      config.quantization or "none", model.weight_bytes, config.tensor_parallel_size,
                      cpu_kernels, plan.decode_path, plan.linear_kernel_summary, plan.allocator)
    return LLMEngine(config, model_config, tokenizer, scheduler, runner, cache_info, info, max_model_len)
