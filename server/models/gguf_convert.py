"""One-time conversion of a llama.cpp GGUF file into a Hugging Face style model folder.

The folder holds ``config.json``, ``model.safetensors`` (float32, the exact dequantized values),
``tokenizer.json`` and ``tokenizer_config.json``, so that the engine and
``transformers.LlamaForCausalLM.from_pretrained`` load the very same weights.
"""

import json
import re
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

# Bump whenever the produced folder changes, so that caches written by an older converter are not reused.
CONVERTER_VERSION = 1

# GGUF does not record the dtype the model was trained in; bfloat16 is SmolLM2's (and most Llamas').
NATIVE_TORCH_DTYPE = "bfloat16"

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

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
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_TENSOR_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Write the HF folder for ``gguf_path`` into the existing, empty directory ``out_dir``."""
    reader = gguf.GGUFReader(str(gguf_path))
    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path}: GGUF architecture {arch!r} is not supported, only 'llama'")

    tensors = _convert_tensors(reader, meta)
    config = _hf_config(
        meta,
        vocab_size=tensors["model.embed_tokens.weight"].shape[0],
        tie_word_embeddings="lm_head.weight" not in tensors,
    )
    out_dir = Path(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(meta), indent=2) + "\n")


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


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_TENSOR_NAME.fullmatch(gguf_name)
    if match and match.group(2) in _BLOCK_TENSORS:
        return f"model.layers.{match.group(1)}.{_BLOCK_TENSORS[match.group(2)]}.weight"
    # e.g. rope_freqs (Llama 3.1 RoPE scaling), which the engine cannot honour: refuse rather than drift.
    raise ValueError(f"GGUF tensor {gguf_name!r} is not supported by the Llama converter")


def _convert_tensors(reader: gguf.GGUFReader, meta: _Metadata) -> dict[str, torch.Tensor]:
    n_head = meta.get("llama.attention.head_count")
    n_head_kv = meta.get("llama.attention.head_count_kv", n_head)
    tensors: dict[str, torch.Tensor] = {}
    progress = tqdm(reader.tensors, desc="Dequantizing GGUF", unit="tensor", file=sys.stderr, disable=None)
    for tensor in progress:
        name = _hf_name(tensor.name)
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        if name.endswith("q_proj.weight"):
            weight = unpermute_qk(weight, n_head)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_qk(weight, n_head_kv)
        tensors[name] = torch.from_numpy(np.require(weight, np.float32, ["C_CONTIGUOUS", "WRITEABLE"]))
    return tensors


def _hf_config(meta: _Metadata, vocab_size: int, tie_word_embeddings: bool) -> dict[str, Any]:
    hidden = meta.get("llama.embedding_length")
    n_head = meta.get("llama.attention.head_count")
    head_dim = meta.get("llama.attention.key_length", hidden // n_head)
    rope_dims = meta.get("llama.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise ValueError(f"partial rotary embeddings ({rope_dims} of {head_dim} dims) are not supported")
    if meta.get("llama.rope.scaling.type", "none") != "none":
        raise ValueError("RoPE scaling is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": meta.get("llama.feed_forward_length"),
        "num_hidden_layers": meta.get("llama.block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": meta.get("llama.attention.head_count_kv", n_head),
        "head_dim": head_dim,
        "rms_norm_eps": meta.get("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": meta.get("llama.rope.freq_base", 10000.0),
        "rope_scaling": None,
        "max_position_embeddings": meta.get("llama.context_length"),
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id", None),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": NATIVE_TORCH_DTYPE,
    }


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    # Other pre-tokenizer names (llama-bpe, qwen2, ...) use their own split regexes that are not
    # reproduced here; the GPT-2 regex is the closest general fallback and is exact for 'gpt2'/'default'.
    return byte_level


def _build_tokenizer(meta: _Metadata) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported, only byte-level BPE ('gpt2')")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    token_types = meta.get("tokenizer.ggml.token_type", [])
    special = [tokens[i] for i, kind in enumerate(token_types) if kind == _TOKEN_TYPE_CONTROL]
    user_defined = [tokens[i] for i, kind in enumerate(token_types) if kind == _TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in special])
    tokenizer.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in user_defined])
    return tokenizer


def _tokenizer_config(meta: _Metadata) -> dict[str, Any]:
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id", None)
        return None if token_id is None else tokens[token_id]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.get("llama.context_length"),
    }
    chat_template = meta.get("tokenizer.chat_template", None)
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config
