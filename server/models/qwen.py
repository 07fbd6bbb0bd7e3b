"""Qwen2 / Qwen2.5 (biases on Q, K and V) and Qwen3 (RMSNorm over each head's queries and keys, no biases). Both
are Llama blocks otherwise; a sliding window applies only where the config turns it on."""

from server.models import llama
from server.models.config import ModelConfig
from server.models.decoder import DecoderWeights
from server.models.layers import LinearFactory, Weights


def build_qwen2(config: ModelConfig, weights: Weights, linear: LinearFactory) -> DecoderWeights:
    """Llama's reading, which takes the Q/K/V biases wherever the checkpoint has them."""
    return llama.build(config, weights, linear)


def build_qwen3(config: ModelConfig, weights: Weights, linear: LinearFactory) -> DecoderWeights:
    model = llama.build(config, weights, linear)
    for index, layer in enumerate(model.layers):
        attn = f"model.layers.{index}.self_attn."
        layer.attention.q_norm = weights[attn + "q_norm.weight"]
        layer.attention.k_norm = weights[attn + "k_norm.weight"]
    return model
