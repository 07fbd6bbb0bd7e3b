"""Rank 0's model under tensor parallelism: its own shard, run in step with the workers' shards.

The model runner uses it as it uses a ``DecoderModel``; each forward pass and each logits call goes to the workers
first, so that every rank runs the same collectives in the same order. The scheduler, the block table and the
sampler stay here, on rank 0 alone.
"""

import atexit
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from kernels.backend import AttentionBackend, AttentionMetadata, LayerOps
from server.config import EngineConfig
from server.distributed.environment import launched_rank
from server.distributed.group import (
    START_TIMEOUT_S,
    TensorParallelGroup,
    join_group,
    leave_group,
    rank_device,
)
from server.distributed.launch import TensorParallelError, Workers, launch_workers
from server.distributed.messages import Allocate, Forward, Logits, RankSetup, pack_step
from server.distributed.rank_model import build_rank_model, kv_capacity
from server.distributed.sharding import check_divides
from server.engine.kv_pool import device_memory_in_use
from server.engine.precision import Precision, resolve_precision
from server.models.config import ModelConfig
from server.models.decoder import DecoderModel


class TensorParallelModel:
    """A ``Model`` (server/models/interface.py) whose every call runs on all ranks."""

    def __init__(
        self,
        model: DecoderModel,
        group: TensorParallelGroup,
        workers: Workers,
        device: torch.device,
        precision: Precision,
        weight_bytes: int,
    ) -> None:
        self.model = model
        self.group = group
        self.workers = workers
        self.device = device
        self.precision = precision
        self.weight_bytes = weight_bytes  # over every rank
        self.rank_step_durations_s: tuple[float, ...] = ()
        self._lost: str | None = None
        self._closed = False
        atexit.register(self.close)

    @property
    def config(self) -> ModelConfig:
        """Rank 0's share of the model: the runner sizes its KV pool by it."""
        return self.model.config

    @property
    def attention(self) -> AttentionBackend:
        return self.model.attention

    @property
    def layer_ops(self) -> LayerOps:
        return self.model.layer_ops

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.model.weight_dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        started = time.perf_counter()
        with self._guard():
            layout, packed = pack_step(input_ids, positions, meta)
            self.workers.send(Forward(layout))
            self.group.broadcast(packed)
            hidden = self.model.forward(input_ids, positions, kv_caches, meta)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            own = time.perf_counter() - started
            self.rank_step_durations_s = (own, *self.workers.receive_numbers())
        return hidden

    def linear_kernels(self) -> dict[str, str]:
        return self.model.linear_kernels()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        with self._guard():
            self.workers.send(Logits(hidden.shape[0]))
            self.group.broadcast(hidden.contiguous())
            return self.model.compute_logits(hidden)

    def close(self) -> None:
        """Stop the workers and leave the process group; the model cannot run after."""
        if self._closed:
            return
        self._closed = True
        self.workers.stop()
        leave_group()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Any failure across ranks (a worker gone, a collective or a line broken or timed out) ends the group:
        the workers are stopped, and this and every later call raise TensorParallelError."""
        if self._lost is not None:
            raise TensorParallelError(self._lost)
        try:
            self.workers.check_alive()
            yield
        except (RuntimeError, OSError) as error:
            lost = isinstance(error, TensorParallelError)
            self._lost = str(error) if lost else f"a tensor-parallel rank failed: {error}"
            self.close()
            raise TensorParallelError(self._lost) from error


def start_tensor_parallel(
    config: EngineConfig, folder: Path, model_config: ModelConfig
) -> tuple[TensorParallelModel, int]:
    """Rank 0's model and the number of KV blocks every rank's pool holds, once every worker has loaded its shard.
    Raises ValueError, before starting anything, where the size does not fit the model or the machine."""
    size = config.tensor_parallel_size
    check_divides(model_config, size)
    if dist.is_initialized():
        raise ValueError("tensor parallelism runs one engine per process: serve one model with --tensor-parallel-size")
    device = rank_device(config.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda" and launched_rank(os.environ) is None and torch.cuda.device_count() < size:
        raise ValueError(f"--tensor-parallel-size {size} needs {size} GPUs; {torch.cuda.device_count()} visible")
    setup = RankSetup(config, folder, model_config, resolve_precision(config, model_config, device))
    store, workers = launch_workers(size)
    try:
        workers.send(setup)
        group = join_group(store, 0, size, device)
        in_use_before_load = device_memory_in_use(device)
        model = build_rank_model(setup, group, device)
        capacities = [kv_capacity(setup, size, device, in_use_before_load), *workers.receive_numbers(START_TIMEOUT_S)]
        weight_bytes = [model.weight_bytes, *workers.receive_numbers(START_TIMEOUT_S)]
        num_blocks = int(min(capacities))
        workers.send(Allocate(num_blocks))
    except BaseException:
        workers.stop()
        leave_group()
        raise
    parallel = TensorParallelModel(model, group, workers, device, setup.precision, int(sum(weight_bytes)))
    return parallel, num_blocks
