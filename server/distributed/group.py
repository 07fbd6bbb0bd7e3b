"""The process group of a tensor-parallel engine: joining it, torchrun's environment, and the three collectives
the forward pass needs.

Every collective is bounded: the forward pass's run in a group with ``STEP_TIMEOUT_S``, and gloo fails at once
when a peer's connection drops (a killed rank). Joining waits at most ``START_TIMEOUT_S``, which covers loading a
large model.
"""

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

START_TIMEOUT_S = 900.0
STEP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TensorParallelGroup:
    rank: int
    size: int
    process_group: dist.ProcessGroup

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place: the sum over the ranks."""
        dist.all_reduce(tensor, group=self.process_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor, group=self.process_group)
        return parts

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place: rank 0's ``tensor`` on every rank."""
        dist.broadcast(tensor, 0, group=self.process_group)
        return tensor


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(name: str, local_rank: int) -> torch.device:
    """``--device`` for one rank: on CUDA, the rank's own GPU (its local rank); else the device named."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def open_store(rank: int, size: int) -> dist.TCPStore:
    """The rendezvous store at MASTER_ADDR:MASTER_PORT: rank 0 hosts it, unless torchrun's agent already does."""
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, hosts,
        timeout=timedelta(seconds=START_TIMEOUT_S), wait_for_workers=False,
    )


def join_group(store: dist.Store, rank: int, size: int, device: torch.device) -> TensorParallelGroup:
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # The ranks share the machine's cores: all of them each would only make them wait on each other.
        torch.set_num_threads(max(1, torch.get_num_threads() // size))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # A collective past its timeout raises in the caller instead of the watchdog ending the process.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    dist.init_process_group(
        backend_for(device), store=dist.PrefixStore("vigil-tp", store), rank=rank, world_size=size,
        timeout=timedelta(seconds=START_TIMEOUT_S),
    )
    steps = dist.new_group(list(range(size)), timeout=timedelta(seconds=STEP_TIMEOUT_S))
    return TensorParallelGroup(rank, size, steps)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
