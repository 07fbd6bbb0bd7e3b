"""What rank 0 tells its workers: the set-up once, then per step a forward pass or logits, and finally stop.

A step's integer tensors (token ids, positions and the attention metadata's tensors) do not travel in the
message: they go in one int64 broadcast over the process group, device to device, and ``StepLayout`` says how to
cut it up again.
"""

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.backend import AttentionMetadata
from server.config import EngineConfig
from server.engine.precision import Precision
from server.models.config import ModelConfig


@dataclass(frozen=True)
class RankSetup:
    """What every rank builds its shard from; ``model_config`` is the whole model's."""

    config: EngineConfig
    folder: Path
    model_config: ModelConfig
    precision: Precision


@dataclass(frozen=True)
class Allocate:
    """The KV pool's size, the smallest any rank has room for: every rank's pool takes the same block table."""

    num_blocks: int


@dataclass(frozen=True)
class StepLayout:
    """Names, shapes and dtypes of the tensors packed in a step's broadcast, in order; and the attention
    metadata's host-side fields."""

    tensors: tuple[tuple[str, tuple[int, ...], torch.dtype], ...]
    host_fields: dict[str, object]

    @property
    def numel(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.tensors)


@dataclass(frozen=True)
class Forward:
    layout: StepLayout


@dataclass(frozen=True)
class Logits:
    """Logits of ``rows`` hidden states, which follow in a broadcast."""

    rows: int


@dataclass(frozen=True)
class Stop:
    pass


def pack_step(
    input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
) -> tuple[StepLayout, torch.Tensor]:
    tensors = {"input_ids": input_ids, "positions": positions}
    host_fields = {}
    for field in dataclasses.fields(meta):
        value = getattr(meta, field.name)
        if isinstance(value, torch.Tensor):
            tensors[field.name] = value
        else:
            host_fields[field.name] = value
    layout = StepLayout(tuple((name, tuple(t.shape), t.dtype) for name, t in tensors.items()), host_fields)
    return layout, torch.cat([t.reshape(-1).to(torch.int64) for t in tensors.values()])


def unpack_step(layout: StepLayout, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    tensors = {}
    offset = 0
    for name, shape, dtype in layout.tensors:
        count = math.prod(shape)
        tensors[name] = packed[offset : offset + count].reshape(shape).to(dtype)
        offset += count
    input_ids, positions = tensors.pop("input_ids"), tensors.pop("positions")
    return input_ids, positions, AttentionMetadata(**tensors, **layout.host_fields)

