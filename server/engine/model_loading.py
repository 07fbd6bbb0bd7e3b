"""A model's weights from its folder to a ``DecoderModel`` on its device, with the kernels the device runs; a
tensor-parallel rank loads its share the same way."""

from collections.abc import Callable
from pathlib import Path

import torch

from kernels.backend import select_attention_backend, select_layer_ops
from server.config import EngineConfig
from server.engine.precision import Precision
from server.models.config import ModelConfig
from server.models.decoder import DecoderModel
from server.models.layers import Weights
from server.models.linear import make_linear
from server.models.loader import load_weights
from server.models.registry import build_model


def load_model(
    config: EngineConfig,
    folder: Path,
    model_config: ModelConfig,
    device: torch.device,
    precision: Precision,
    shard: Callable[[Weights], Weights] | None = None,
) -> DecoderModel:
    """The model on ``device``. A tensor-parallel rank gives its share of the model as ``model_config`` and
    ``shard``, which cuts the checkpoint's tensors to that share before they move to the device."""
    weights = load_weights(folder, precision.dtype)
    if shard is not None:
        weights = shard(weights)
    weights = {name: w.to(device) for name, w in weights.items()}
    invariant = config.batch_invariant
    return build_model(
        model_config, weights,
        lambda weight: make_linear(weight, precision.weight_dtype, config.quantization, row_invariant=invariant),
        select_attention_backend(device, invariant), select_layer_ops(device), device, precision.weight_dtype,
    )
