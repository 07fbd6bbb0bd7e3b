"""A tensor-parallel worker, rank 1..N-1: ``python -m server.distributed.worker`` as rank 0 starts it, or
``python -m server ...`` under torchrun (server.__main__ sends ranks above 0 here).

It connects to rank 0, builds its shard of the model and its own KV pool (rank 0's block table addresses it),
then runs what rank 0 sends: forward passes, logits, stop. It ignores SIGINT and SIGTERM, so that a server that
drains on a signal keeps its workers until the drain ends; it exits when rank 0 closes the line or dies.
"""

import logging
import os
import signal
import sys
import time

import torch

from server.distributed.channel import Channel
from server.distributed.group import TensorParallelGroup, join_group, leave_group, open_store, rank_device
from server.distributed.launch import COMMAND_ADDRESS_KEY
from server.distributed.messages import Allocate, Forward, Logits, RankSetup, unpack_step
from server.distributed.rank_model import build_rank_model, kv_capacity
from server.distributed.sharding import rank_config
from server.engine.kv_pool import allocate_kv_caches, device_memory_in_use
from server.models.decoder import DecoderModel

logger = logging.getLogger("vigil.distributed")

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        store = open_store(rank, size)
        host, port = store.get(COMMAND_ADDRESS_KEY).decode().rsplit(":", 1)
        channel = Channel.connect((host, int(port)))
        channel.send_number(rank)
        setup = channel.receive_message()
        if not isinstance(setup, RankSetup):
            return 0  # rank 0 gave up before the set-up
        device = rank_device(setup.config.device, int(os.environ.get("LOCAL_RANK", rank)))
        group = join_group(store, rank, size, device)
        in_use_before_load = device_memory_in_use(device)
        model = build_rank_model(setup, group, device)
        channel.send_number(kv_capacity(setup, size, device, in_use_before_load))
        channel.send_number(model.weight_bytes)
        allocate = channel.receive_message()
        if isinstance(allocate, Allocate):
            kv_caches = rank_kv_caches(setup, size, allocate.num_blocks, device)
            logger.info("tensor-parallel rank %d of %d serving on %s", rank, size, device)
            serve(channel, model, kv_caches, group, device)
        return 0
    except Exception:
        logger.exception("tensor-parallel rank %d failed", rank)
        return 1
    finally:
        leave_group()


def rank_kv_caches(setup: RankSetup, size: int, num_blocks: int, device: torch.device) -> KVCaches:
    """This rank's KV heads of every block, K and V per layer, in the layout the model runner uses."""
    return allocate_kv_caches(rank_config(setup.model_config, size), num_blocks, setup.config.block_size,
                              setup.precision.kv_dtype, device)


def serve(
    channel: Channel, model: DecoderModel, kv_caches: KVCaches, group: TensorParallelGroup, device: torch.device
) -> None:
    """Run rank 0's commands until it says stop or closes the line. After each forward pass, report its wall
    time."""
    while True:
        message = channel.receive_message()
        if isinstance(message, Forward):
            started = time.perf_counter()
            packed = torch.empty(message.layout.numel, dtype=torch.int64, device=device)
            input_ids, positions, meta = unpack_step(message.layout, group.broadcast(packed))
            model.forward(input_ids, positions, kv_caches, meta)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            channel.send_number(time.perf_counter() - started)
        elif isinstance(message, Logits):
            hidden = torch.empty((message.rows, model.config.hidden_size), dtype=model.dtype, device=device)
            model.compute_logits(group.broadcast(hidden))
        else:
            return


if __name__ == "__main__":
    sys.exit(main())
