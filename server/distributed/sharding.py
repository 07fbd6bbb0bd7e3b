"""How a checkpoint splits over tensor-parallel ranks, Megatron's way, by Hugging Face parameter name and before a
family reads it:

- column-parallel (each rank keeps a slice of the output rows): Q, K and V by heads, gate and up by MLP width;
  fused checkpoints (Phi-3's ``qkv_proj`` and ``gate_up_proj``) are cut section by section;
- row-parallel (each rank keeps a slice of the input columns, and the ranks' partial sums are added): the
  attention's output projection and the MLP's down projection;
- vocabulary-parallel: the embedding table and the output layer, by token rows, padded to a multiple of the size;
- everything else (norms, QK-norms) whole on every rank.

Rank ``r``'s query heads are the ones that read its KV heads, so each rank attends on its own.
"""

import dataclasses

import torch

from server.models.config import ModelConfig
from server.models.layers import Weights

_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")
_VOCABULARY = ("model.embed_tokens", "lm_head")


def check_divides(config: ModelConfig, size: int) -> None:
    """Raises ValueError, in one line, where ``size`` ranks cannot split the heads or the MLP evenly."""
    counts = {
        "attention heads": config.num_attention_heads,
        "KV heads": config.num_key_value_heads,
        "MLP width (intermediate_size)": config.intermediate_size,
    }
    uneven = [f"{count} {name}" for name, count in counts.items() if count % size]
    if uneven:
        raise ValueError(f"--tensor-parallel-size {size} does not divide the model's {' and '.join(uneven)}")


def rank_config(config: ModelConfig, size: int) -> ModelConfig:
    """The model as one rank runs it: its share of the heads and of the MLP."""
    return dataclasses.replace(
        config,
        num_attention_heads=config.num_attention_heads // size,
        num_key_value_heads=config.num_key_value_heads // size,
        intermediate_size=config.intermediate_size // size,
    )


def vocab_rows_per_rank(vocab_size: int, size: int) -> int:
    return -(-vocab_size // size)


def shard_weights(weights: Weights, config: ModelConfig, rank: int, size: int) -> Weights:
    """Rank ``rank``'s part of every tensor of a checkpoint of ``config``; raises ValueError on a matrix it does
    not know how to split."""
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    fused_sections = {"self_attn.qkv_proj": [q_size, kv_size, kv_size],
                      "mlp.gate_up_proj": [config.intermediate_size] * 2}

    def part(tensor: torch.Tensor, dim: int, sections: list[int] | None = None) -> torch.Tensor:
        """This rank's slice of each section along ``dim``, the slices stacked again."""
        pieces = tensor.split(sections or [tensor.shape[dim]], dim)
        return torch.cat([piece.chunk(size, dim)[rank] for piece in pieces], dim).contiguous()

    sharded: Weights = {}
    for name, tensor in weights.items():
        module, _, kind = name.rpartition(".")
        if module.endswith(_COLUMN):
            sharded[name] = part(tensor, 0)
        elif any(module.endswith(fused) for fused in fused_sections):
            sharded[name] = part(tensor, 0, next(s for f, s in fused_sections.items() if module.endswith(f)))
        elif module.endswith(_ROW) and kind == "weight":
            sharded[name] = part(tensor, 1)
        elif module in _VOCABULARY:
            sharded[name] = _vocab_rows(tensor, rank, size)
        elif tensor.ndim <= 1 and not module.endswith(_ROW):
            sharded[name] = tensor
        else:
            raise ValueError(f"tensor parallelism does not know how to split {name}")
    return sharded


def _vocab_rows(table: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rows ``[rank * per, (rank + 1) * per)``; the last rank's are padded with zeros past the vocabulary."""
    per = vocab_rows_per_rank(table.shape[0], size)
    rows = table[rank * per : (rank + 1) * per]
    if rows.shape[0] < per:
        rows = torch.cat([rows, rows.new_zeros(per - rows.shape[0], *rows.shape[1:])])
    return rows.contiguous()
