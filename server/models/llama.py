"""Llama and Mistral: pre-norm blocks of attention with separate Q/K/V projections and a SwiGLU MLP. Mistral is a
Llama whose layers attend through a sliding window, which its config gives (``ModelConfig.layer_windows``)."""

from server.models.config import ModelConfig
from server.models.decoder import AttentionWeights, DecoderLayer, DecoderWeights, MLPWeights, read_decoder
from server.models.layers import LinearFactory, Weights, fused, fused_bias


def build(config: ModelConfig, weights: Weights, linear: LinearFactory) -> DecoderWeights:
    return read_decoder(config, weights, linear, lambda prefix: llama_layer(weights, prefix, linear))


def llama_layer(weights: Weights, prefix: str, linear: LinearFactory) -> DecoderLayer:
    """One Llama block, with the Q/K/V biases that Qwen2's blocks add, wherever the checkpoint has them."""
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    return DecoderLayer(
        input_norm=weights[prefix + "input_layernorm.weight"],
        attention=AttentionWeights(
            qkv=linear(fused(weights, [attn + f"{n}_proj.weight" for n in "qkv"])),
            o_proj=linear(weights[attn + "o_proj.weight"]),
            qkv_bias=fused_bias(weights, [attn + f"{n}_proj.bias" for n in "qkv"]),
        ),
        mlp_norm=weights[prefix + "post_attention_layernorm.weight"],
        mlp=MLPWeights(
            gate_up=linear(fused(weights, [mlp + "gate_proj.weight", mlp + "up_proj.weight"])),
            down=linear(weights[mlp + "down_proj.weight"]),
        ),
    )
