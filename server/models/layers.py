"""The pieces the model families share: rotary tables, norm weights, the MLP's gated activations, and the
fused projections their checkpoints are loaded into."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kernels.backend import LayerOps
from server.models.linear import Linear

Weights = dict[str, torch.Tensor]
# Makes the Linear of one weight matrix (dense, fp16-packed or quantised: the builder's choice).
LinearFactory = Callable[[torch.Tensor], Linear]
# gate_up -> act(gate) * up, for a fused [tokens, 2 * intermediate] row.
GatedActivation = Callable[[torch.Tensor], torch.Tensor]


class TokenEmbedding:
    """Token ids to rows of the embedding table (held in the weight dtype), in the compute dtype."""

    def __init__(self, table: torch.Tensor, dtype: torch.dtype) -> None:
        self.table = table
        self.dtype = dtype
        self.nbytes = table.nbytes

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.table).to(self.dtype)


class RotaryEmbedding:
    """cos and sin of every position's angles, fp32 ``[max_positions, head_dim]``, halves repeated."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(device)
        self.sin = angles.sin().to(device)


def rotary_tables(
    thetas: tuple[float, ...], head_dim: int, max_positions: int, device: torch.device
) -> list[RotaryEmbedding]:
    """One table per layer, shared between the layers with the same base (Gemma 3 has two)."""
    tables = {theta: RotaryEmbedding(head_dim, theta, max_positions, device) for theta in set(thetas)}
    return [tables[theta] for theta in thetas]


def offset_norm(weight: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm scales by ``1 + weight``, summed in fp32 as transformers does; the result is an ordinary
    norm weight."""
    return (1.0 + weight.float()).to(weight.dtype)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# The config's hidden_act for SwiGLU, then those for GeGLU with tanh GELU.
GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_tanh")


def gated_activation(hidden_act: str, ops: LayerOps) -> GatedActivation:
    """SwiGLU runs in the layer ops' kernel; GeGLU in torch."""
    if hidden_act not in GATED_ACTIVATIONS:
        raise ValueError(f"the MLP activation {hidden_act!r} is not supported")
    return ops.silu_mul if hidden_act == "silu" else gelu_tanh_mul


def fused(weights: Weights, names: list[str]) -> torch.Tensor:
    """Matrices stacked along their output rows: Q/K/V into one projection, gate and up into another."""
    return torch.cat([weights[name] for name in names])


def fused_bias(weights: Weights, names: list[str]) -> torch.Tensor | None:
    """The biases of ``names`` stacked as their matrices are, or None where the checkpoint has none."""
    if not all(name in weights for name in names):
        return None
    return torch.cat([weights[name] for name in names])

