"""One-time conversion of a llama.cpp GGUF file into a Hugging Face style model folder.

The folder holds ``config.json``, ``model.safetensors`` (float32, the exact dequantized values),
``tokenizer.json`` and ``tokenizer_config.json``, so that the engine and transformers'
``from_pretrained`` load the very same weights. Each architecture llama.cpp writes differently is undone here:
Llama's Q/K rows are interleaved for its RoPE kernel, Gemma's norms are stored as ``1 + weight``, and the tensor
names differ where a family has norms Llama has not.
"""

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from server.models.config import (
    FULL_ATTENTION,
    GEMMA3_SLIDING_WINDOW_PATTERN,
    SLIDING_ATTENTION,
    UnsupportedModelError,
)
from server.models.gguf_tokenizer import build_tokenizer, tokenizer_config

# Bump whenever the produced folder changes, so that caches written by an older converter are not reused.
CONVERTER_VERSION = 2

# GGUF does not record the dtype the model was trained in; bfloat16 is that of every family read here.
NATIVE_TORCH_DTYPE = "bfloat16"

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# llama.cpp's hard-wired RoPE base for Gemma 3's sliding layers.
GEMMA3_LOCAL_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class Architecture:
    """How one GGUF ``general.architecture`` maps onto its Hugging Face model."""

    hf_architecture: str
    model_type: str
    permute_qk: bool = False
    norm_offset: float = 0.0
    renames: dict[str, str] = field(default_factory=dict)


ARCHITECTURES = {
    "llama": Architecture("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": Architecture("Qwen2ForCausalLM", "qwen2"),
    "qwen3": Architecture("Qwen3ForCausalLM", "qwen3"),
    "phi3": Architecture("Phi3ForCausalLM", "phi3", renames={"ffn_up": "mlp.gate_up_proj"}),
    "gemma3": Architecture("Gemma3ForCausalLM", "gemma3_text", norm_offset=1.0, renames={
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }),
}


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Write the HF folder for ``gguf_path`` into the existing, empty directory ``out_dir``."""
    reader = gguf.GGUFReader(str(gguf_path))
    meta = _Metadata(reader)
    name = meta.get("general.architecture")
    if name not in ARCHITECTURES:
        raise UnsupportedModelError(f"{gguf_path}: GGUF architecture {name!r} is not supported, only "
                         f"{', '.join(repr(a) for a in ARCHITECTURES)}")
    arch = ARCHITECTURES[name]
    tensors = _convert_tensors(reader, meta, name, arch)
    config = _hf_config(
        meta, name, arch,
        vocab_size=tensors["model.embed_tokens.weight"].shape[0],
        tie_word_embeddings="lm_head.weight" not in tensors,
    )
    out_dir = Path(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    build_tokenizer(meta, name).save(str(out_dir / "tokenizer.json"))
    context_length = meta.get(f"{name}.context_length", None)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(meta, context_length), indent=2) + "\n")


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's Q/K row permutation, giving back HF's rotate-half layout.

    llama.cpp stores each head's rows interleaved as (x0, x_half, x1, x_half+1, ...) for its
    RoPE kernel: ``w.reshape(n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2)``.
    """
    rows, rest = weight.shape[0], weight.shape[1:]
    return weight.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


class _Metadata:
    def __init__(self, reader: gguf.GGUFReader) -> None:
        self._fields = reader.fields

    def get(self, key: str, default: Any = ...) -> Any:
        field = self._fields.get(key)
        if field is None:
            if default is ...:
                raise ValueError(f"GGUF metadata key {key!r} is missing")
            return default
        return field.contents()


def _hf_name(gguf_name: str, arch: Architecture) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_TENSOR_NAME.fullmatch(gguf_name)
    if match:
        layer, part, kind = match.groups()
        hf_part = arch.renames.get(part, _BLOCK_TENSORS.get(part))
        if hf_part is not None:
            return f"model.layers.{layer}.{hf_part}.{kind}"
    # e.g. rope_freqs (Llama 3.1 RoPE scaling), which the engine cannot honour: refuse rather than drift.
    raise UnsupportedModelError(f"GGUF tensor {gguf_name!r} is not supported by the converter")


def _convert_tensors(
    reader: gguf.GGUFReader, meta: _Metadata, name: str, arch: Architecture
) -> dict[str, torch.Tensor]:
    n_head = meta.get(f"{name}.attention.head_count")
    n_head_kv = meta.get(f"{name}.attention.head_count_kv", n_head)
    tensors: dict[str, torch.Tensor] = {}
    progress = tqdm(reader.tensors, desc="Dequantizing GGUF", unit="tensor", file=sys.stderr, disable=None)
    for tensor in progress:
        hf_name = _hf_name(tensor.name, arch)
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if arch.permute_qk and hf_name.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, n_head)
        elif arch.permute_qk and hf_name.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, n_head_kv)
        if arch.norm_offset and hf_name.endswith("norm.weight"):
            weight = weight - arch.norm_offset
        tensors[hf_name] = torch.from_numpy(np.require(weight, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
    return tensors


def _hf_config(
    meta: _Metadata, name: str, arch: Architecture, vocab_size: int, tie_word_embeddings: bool
) -> dict[str, Any]:
    hidden = meta.get(f"{name}.embedding_length")
    n_head = meta.get(f"{name}.attention.head_count")
    n_layers = meta.get(f"{name}.block_count")
    head_dim = meta.get(f"{name}.attention.key_length", hidden // n_head)
    rope_dims = meta.get(f"{name}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedModelError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    if meta.get(f"{name}.rope.scaling.type", "none") != "none":
        raise UnsupportedModelError("RoPE scaling is not supported")
    window = meta.get(f"{name}.attention.sliding_window", None)
    config = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": meta.get(f"{name}.feed_forward_length"),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": meta.get(f"{name}.attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "rms_norm_eps": meta.get(f"{name}.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.get(f"{name}.rope.freq_base", 10000.0),
        "rope_scaling": None,
        "max_position_embeddings": meta.get(f"{name}.context_length"),
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id", None),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "sliding_window": window,
        "torch_dtype": NATIVE_TORCH_DTYPE,
    }
    if name == "llama" and window:
        # Mistral is written as a Llama; a sliding window is what tells it apart.
        config |= {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    if name == "gemma3":
        config |= _gemma3_config(hidden, n_head, n_layers, head_dim, window)
    return config


def _gemma3_config(hidden: int, n_head: int, n_layers: int, head_dim: int, window: int | None) -> dict[str, Any]:
    """What llama.cpp knows of Gemma 3 without reading it from the file: every sixth layer is global, the sliding
    layers' RoPE base, GeGLU, and the query scale (the 27B model's, 62 layers, is hidden / heads)."""
    pattern = GEMMA3_SLIDING_WINDOW_PATTERN
    layer_types = [SLIDING_ATTENTION if (i + 1) % pattern and window else FULL_ATTENTION for i in range(n_layers)]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": layer_types,
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
        "query_pre_attn_scalar": hidden // n_head if n_layers == 62 else head_dim,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }
