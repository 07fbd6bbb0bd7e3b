"""One rank's model and KV pool size: the same on rank 0 and on every worker."""

import torch

from server.distributed.group import TensorParallelGroup
from server.distributed.messages import RankSetup
from server.distributed.parallel_layers import parallelize
from server.distributed.sharding import rank_config, shard_weights
from server.engine.kv_pool import count_kv_blocks, kv_bytes_per_block
from server.engine.model_loading import load_model
from server.models.decoder import DecoderModel


def build_rank_model(setup: RankSetup, group: TensorParallelGroup, device: torch.device) -> DecoderModel:
    whole = setup.model_config
    model = load_model(
        setup.config, setup.folder, rank_config(whole, group.size), device, setup.precision,
        lambda weights: shard_weights(weights, whole, group.rank, group.size),
    )
    return parallelize(model, group, whole.vocab_size)


def kv_capacity(setup: RankSetup, size: int, device: torch.device, in_use_before_load: int) -> int:
    """The KV blocks this rank has room for, each holding its share of the KV heads."""
    per_block = kv_bytes_per_block(rank_config(setup.model_config, size), setup.config.block_size,
                                   setup.precision.kv_dtype)
    return count_kv_blocks(setup.config, per_block, device, in_use_before_load)
