"""What the model runner needs of a model: one process's ``DecoderModel`` and rank 0's ``TensorParallelModel``
(server/distributed/driver.py) both are one."""

from typing import Protocol

import torch

from kernels.backend import AttentionBackend, AttentionMetadata, LayerOps
from server.models.config import ModelConfig


class Model(Protocol):
    @property
    def config(self) -> ModelConfig:
        """The model's shape as this process holds it (a tensor-parallel rank's share of the heads)."""

    @property
    def attention(self) -> AttentionBackend: ...

    @property
    def layer_ops(self) -> LayerOps: ...

    @property
    def dtype(self) -> torch.dtype:
        """Activations'."""

    @property
    def weight_dtype(self) -> torch.dtype: ...

    @property
    def weight_bytes(self) -> int:
        """Every rank's weights together."""

    @property
    def rank_step_durations_s(self) -> tuple[float, ...]:
        """Per tensor-parallel rank, rank 0 first, the wall time of its last forward pass; empty on one process."""

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the final norm, one row per input token."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def linear_kernels(self) -> dict[str, str]:
        """Each kind of weight matrix (qkv, o_proj, gate_up, down, lm_head) and the kernel that multiplies by it."""
