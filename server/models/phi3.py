"""Phi-3: Llama blocks whose checkpoints already hold Q/K/V as one projection and gate/up as another."""

from server.models.config import ModelConfig
from server.models.decoder import AttentionWeights, DecoderLayer, DecoderWeights, MLPWeights, read_decoder
from server.models.layers import LinearFactory, Weights


def build(config: ModelConfig, weights: Weights, linear: LinearFactory) -> DecoderWeights:
    return read_decoder(config, weights, linear, lambda prefix: _layer(weights, prefix, linear))


def _layer(weights: Weights, prefix: str, linear: LinearFactory) -> DecoderLayer:
    attn, mlp = prefix + "self_attn.", prefix + "mlp."
    return DecoderLayer(
        input_norm=weights[prefix + "input_layernorm.weight"],
        attention=AttentionWeights(
            qkv=linear(weights[attn + "qkv_proj.weight"]), o_proj=linear(weights[attn + "o_proj.weight"])
        ),
        mlp_norm=weights[prefix + "post_attention_layernorm.weight"],
        mlp=MLPWeights(
            gate_up=linear(weights[mlp + "gate_up_proj.weight"]), down=linear(weights[mlp + "down_proj.weight"])
        ),
    )
