"""The architecture of a Llama-family model, read from a Hugging Face ``config.json``."""

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=raw.get("rope_theta", 10000.0),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )

    @classmethod
    def from_folder(cls, folder: Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads((Path(folder) / "config.json").read_text()))
