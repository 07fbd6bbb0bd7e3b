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


def device_memory_in_use(device: torch.device) -> int:
    """Bytes of a CUDA device in use by anyone, 0 on the CPU: taken before an engine loads its weights, so that
    count_kv_blocks can tell the engine's own weights from what was there already."""
    if device.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def gpu_kv_budget(total: int, free: int, in_use_before_load: int, utilization: float) -> int:
    """Bytes for the KV pool: ``utilization`` of the device is this engine's whole share, weights and pool together,
    whatever else the device holds (vLLM's meaning), so two engines of 0.4 fit one device. Raises ValueError when
    the share was not free as the engine started."""
    share = total * utilization
    free_at_start = total - in_use_before_load
    if share > free_at_start:
        raise ValueError(
            f"--gpu-memory-utilization {utilization} asks for {share / 2**30:.1f} GiB of the GPU, but only "
            f"{free_at_start / 2**30:.1f} of its {total / 2**30:.1f} GiB were free: lower it, or free the GPU"
        )
    own_weights = (total - free) - in_use_before_load
    return int(share - own_weights)


def count_kv_blocks(config: EngineConfig, bytes_per_block: int, device: torch.device, in_use_before_load: int) -> int:
    """CPU: ``--kv-cache-memory``. CUDA: what ``--gpu-memory-utilization`` leaves after this engine's weights."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = gpu_kv_budget(total, free, in_use_before_load, config.gpu_memory_utilization)
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
