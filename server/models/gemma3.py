"""Gemma 3's text model: norms that scale by ``1 + weight``, before and after both attention and the MLP; QK-norm;
GeGLU with tanh GELU; embeddings scaled by sqrt(hidden_size); queries scaled by ``query_pre_attn_scalar``; sliding
and global layers interleaved, each kind with its own RoPE base (both from ``ModelConfig``)."""

import torch

from server.models.config import ModelConfig
from server.models.decoder import AttentionWeights, DecoderLayer, DecoderWeights, MLPWeights, read_decoder
from server.models.layers import LinearFactory, Weights, fused, offset_norm


def build(config: ModelConfig, weights: Weights, linear: LinearFactory) -> DecoderWeights:
    return read_decoder(
        config, weights, linear, lambda prefix: _layer(weights, prefix, linear),
        final_norm=offset_norm(weights["model.norm.weight"]), embed_scale=config.hidden_size**0.5,
    )


def _layer(weights: Weights, prefix: str, linear: LinearFactory) -> DecoderLayer:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."

    def norm(name: str) -> torch.Tensor:
        return offset_norm(weights[prefix + name])

    return DecoderLayer(
        input_norm=norm("input_layernorm.weight"),
        attention=AttentionWeights(
            qkv=linear(fused(weights, [attn + f"{n}_proj.weight" for n in "qkv"])),
            o_proj=linear(weights[attn + "o_proj.weight"]),
            q_norm=norm("self_attn.q_norm.weight"),
            k_norm=norm("self_attn.k_norm.weight"),
            output_norm=norm("post_attention_layernorm.weight"),
        ),
        mlp_norm=norm("pre_feedforward_layernorm.weight"),
        mlp=MLPWeights(
            gate_up=linear(fused(weights, [mlp + "gate_proj.weight", mlp + "up_proj.weight"])),
            down=linear(weights[mlp + "down_proj.weight"]),
            output_norm=norm("post_feedforward_layernorm.weight"),
        ),
    )
