"""The KV pool's size and tensors: bytes per block, how many blocks fit, and the per-layer K and V tensors (the
same on one process and on every tensor-parallel rank)."""

import torch

from kernels import huge_pages
from server.config import EngineConfig
from server.models.config import ModelConfig


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V, every layer, one block."""
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    return per_token * block_size * dtype.itemsize


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


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's K and V, zeroed (on huge pages where the host has them)."""
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [(huge_pages.zeros_on(device, shape, dtype), huge_pages.zeros_on(device, shape, dtype))
            for _ in range(config.num_hidden_layers)]
