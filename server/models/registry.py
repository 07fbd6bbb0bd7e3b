"""Which family reads a checkpoint, keyed by the ``architectures`` entry of its config."""

from collections.abc import Callable

import torch

from kernels.backend import AttentionBackend, LayerOps
from server.models import gemma3, llama, phi3, qwen
from server.models.config import ModelConfig, UnsupportedModelError
from server.models.decoder import DecoderModel, DecoderWeights
from server.models.layers import LinearFactory, Weights, gated_activation

FamilyBuilder = Callable[[ModelConfig, Weights, LinearFactory], DecoderWeights]

MODEL_FAMILIES: dict[str, FamilyBuilder] = {
    "LlamaForCausalLM": llama.build,
    "MistralForCausalLM": llama.build,
    "Qwen2ForCausalLM": qwen.build_qwen2,
    "Qwen3ForCausalLM": qwen.build_qwen3,
    "Gemma3ForCausalLM": gemma3.build,
    "Phi3ForCausalLM": phi3.build,
}


def family_of(architecture: str) -> FamilyBuilder:
    if architecture not in MODEL_FAMILIES:
        raise UnsupportedModelError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(sorted(MODEL_FAMILIES))}"
        )
    return MODEL_FAMILIES[architecture]


def build_model(
    config: ModelConfig,
    weights: Weights,
    linear: LinearFactory,
    attention: AttentionBackend,
    layer_ops: LayerOps,
    device: torch.device,
    weight_dtype: torch.dtype,
) -> DecoderModel:
    """The model of ``config``'s architecture over ``weights`` (by Hugging Face parameter name)."""
    decoder_weights = family_of(config.architecture)(config, weights, linear)
    activation = gated_activation(config.hidden_act, layer_ops)
    return DecoderModel(config, decoder_weights, activation, attention, layer_ops, device, weight_dtype)
