"""Tiny random checkpoints of every supported family, written locally from the transformers config classes (no
download), as Hugging Face folders and as GGUF files laid out the way llama.cpp writes them.

Every parameter gets noise, norms and biases included, so that a weight read wrongly (a norm without its offset, a
missing bias) changes the tokens. Windows are short, so that the test prompts run past them.
"""

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

SMALL = {
    "vocab_size": 49152, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}
WINDOW = 12


@dataclass(frozen=True)
class Family:
    config_class: str
    architecture: str
    gguf_architecture: str
    overrides: dict = field(default_factory=dict)


FAMILIES = {
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", "qwen2", {"tie_word_embeddings": False}),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", "qwen3", {"head_dim": 32, "tie_word_embeddings": True}),
    "mistral": Family("MistralConfig", "MistralForCausalLM", "llama", {"head_dim": 32, "sliding_window": WINDOW}),
    "gemma3": Family("Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3", {
        # Six layers: five sliding, then a global one, the pattern llama.cpp assumes (GGUF does not record it).
        "head_dim": 32, "sliding_window": WINDOW, "query_pre_attn_scalar": 32, "num_hidden_layers": 6,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
    }),
    "phi3": Family(
        "Phi3Config", "Phi3ForCausalLM", "phi3", {"sliding_window": WINDOW + 2, "tie_word_embeddings": False}
    ),
}
# Gemma 3 with its queries scaled by another scalar than head_dim; GGUF cannot say so (llama.cpp derives it).
GEMMA3_OWN_SCALAR = Family(
    "Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3", {**FAMILIES["gemma3"].overrides, "query_pre_attn_scalar": 24}
)


def write_hf_checkpoint(family: Family, folder: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    """A random checkpoint of ``family`` saved by transformers itself, with SmolLM2's tokenizer."""
    import transformers

    config = getattr(transformers, family.config_class)(**{**SMALL, **family.overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim > 1:
                parameter.normal_(0.0, 0.08)
            else:  # norm weights (ones, or Gemma's zeros) and biases (zeros) get noise around their start, in
                # steps of 2^-10: llama.cpp's 1 + weight for Gemma's norms, and back, is then exact in fp32
                parameter.add_(torch.randn_like(parameter) * 0.1).mul_(1024).round_().div_(1024)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_source / name, folder / name)
    return folder


def write_gguf(family: Family, hf_folder: Path, path: Path, tokenizer_gguf: Path) -> Path:
    """The checkpoint as llama.cpp's converter would write it (float32 tensors), with SmolLM2's GGUF tokenizer."""
    arch = family.gguf_architecture
    config = json.loads((hf_folder / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base((rope.get("full_attention") or rope).get("rope_theta", 10000.0))
    if config.get("sliding_window"):
        writer.add_sliding_window(config["sliding_window"])
    _copy_tokenizer(writer, tokenizer_gguf)
    for name, tensor in load_file(str(hf_folder / "model.safetensors")).items():
        for gguf_name, array in _gguf_tensors(arch, name, tensor.numpy(), heads, kv_heads):
            writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_GEMMA3_NAMES = {
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}


def _gguf_tensors(arch: str, name: str, array: np.ndarray, heads: int, kv_heads: int):
    if arch == "gemma3" and name.endswith("norm.weight"):
        array = array + 1.0  # llama.cpp stores Gemma's norms with their offset
    if name in _GLOBAL_NAMES:
        yield _GLOBAL_NAMES[name], array
        return
    _, _, layer, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    gguf_part = (_GEMMA3_NAMES if arch == "gemma3" else {}).get(part) or _BLOCK_NAMES[part]
    if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
        array = _permute_qk(array, heads if part == "self_attn.q_proj" else kv_heads)
    yield f"blk.{layer}.{gguf_part}.{kind}", array


def _permute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's interleaving of each head's Q/K rows for its RoPE kernel."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape
    )


def _copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> None:
    fields = gguf.GGUFReader(str(source)).fields
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"].contents())
    writer.add_token_list(fields["tokenizer.ggml.tokens"].contents())
    writer.add_token_types(fields["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(fields["tokenizer.ggml.merges"].contents())
    writer.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"].contents())
    writer.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"].contents())
    writer.add_add_bos_token(False)
