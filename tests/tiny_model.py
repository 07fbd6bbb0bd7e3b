"""A tiny random Llama checkpoint (2 layers) written as a Hugging Face folder, with SmolLM2's tokenizer."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def write_tiny_llama(folder: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    cfg = TINY_CONFIG
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.08

    hidden, inter, head_dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    kv_dim = cfg["num_key_value_heads"] * head_dim
    tensors = {"model.embed_tokens.weight": weight(cfg["vocab_size"], hidden), "model.norm.weight": torch.ones(hidden)}
    for i in range(cfg["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        tensors |= {
            prefix + "input_layernorm.weight": torch.ones(hidden),
            prefix + "post_attention_layernorm.weight": torch.ones(hidden),
            prefix + "self_attn.q_proj.weight": weight(cfg["num_attention_heads"] * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": weight(kv_dim, hidden),
            prefix + "self_attn.v_proj.weight": weight(kv_dim, hidden),
            prefix + "self_attn.o_proj.weight": weight(hidden, cfg["num_attention_heads"] * head_dim),
            prefix + "mlp.gate_proj.weight": weight(inter, hidden),
            prefix + "mlp.up_proj.weight": weight(inter, hidden),
            prefix + "mlp.down_proj.weight": weight(hidden, inter),
        }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_source / name, folder / name)
    return folder
