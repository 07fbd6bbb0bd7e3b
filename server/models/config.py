"""The architecture of a decoder-only model, read from a Hugging Face ``config.json``.

Configs come in two spellings: those that transformers 5 writes (``rope_parameters``, ``layer_types``) and older
ones on the Hub (``rope_theta``, ``rope_local_base_freq``, ``use_sliding_window``, ``sliding_window_pattern``);
both are read here into one per-layer description.
"""

import json
from dataclasses import dataclass
from pathlib import Path

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
# Gemma 3 makes every sixth layer global unless its config says otherwise.
GEMMA3_SLIDING_WINDOW_PATTERN = 6


class UnsupportedModelError(ValueError):
    """A model file that is readable, but of an architecture or with a feature Vigil does not run."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
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
    # Per layer: the sliding window (None where the layer attends to the whole context) and the RoPE base.
    layer_windows: tuple[int | None, ...]
    layer_rope_thetas: tuple[float, ...]
    attention_scale: float
    hidden_act: str = "silu"

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        layer_types = read_layer_types(raw)
        thetas = read_rope_thetas(raw)
        window = raw.get("sliding_window")
        scalar = raw.get("query_pre_attn_scalar")
        return cls(
            architecture=cls.architecture_of(raw),
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=thetas[FULL_ATTENTION],
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            layer_windows=tuple(window if kind == SLIDING_ATTENTION else None for kind in layer_types),
            layer_rope_thetas=tuple(thetas[kind] for kind in layer_types),
            attention_scale=(scalar if scalar else head_dim) ** -0.5,
            hidden_act=raw.get("hidden_activation") or raw.get("hidden_act") or "silu",
        )

    @staticmethod
    def architecture_of(raw: dict) -> str:
        """The config's first ``architectures`` entry; Llama for old Llama configs that name none."""
        named = raw.get("architectures") or ["LlamaForCausalLM" if raw.get("model_type") == "llama" else ""]
        return named[0]

    @classmethod
    def from_folder(cls, folder: Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads((Path(folder) / "config.json").read_text()))


def read_layer_types(raw: dict) -> list[str]:
    """Each layer's attention, ``full_attention`` or ``sliding_attention``."""
    count = raw["num_hidden_layers"]
    if raw.get("layer_types"):
        return list(raw["layer_types"])
    model_type = raw.get("model_type", "")
    if not raw.get("sliding_window"):
        return [FULL_ATTENTION] * count
    if model_type in ("qwen2", "qwen3"):
        # Qwen configs carry a sliding_window that only applies with use_sliding_window, from max_window_layers on.
        first = raw.get("max_window_layers", count) if raw.get("use_sliding_window") else count
        return [SLIDING_ATTENTION if i >= first else FULL_ATTENTION for i in range(count)]
    if model_type.startswith("gemma3"):
        pattern = raw.get("sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
        return [SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(count)]
    return [SLIDING_ATTENTION] * count


def read_rope_thetas(raw: dict) -> dict[str, float]:
    """The RoPE base of each kind of layer."""
    params = raw.get("rope_parameters") or {}
    if FULL_ATTENTION in params:  # per layer type, as Gemma 3's
        full = params[FULL_ATTENTION].get("rope_theta", raw.get("rope_theta", 10000.0))
        local = (params.get(SLIDING_ATTENTION) or {}).get("rope_theta", full)
        return {FULL_ATTENTION: full, SLIDING_ATTENTION: local}
    full = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    return {FULL_ATTENTION: full, SLIDING_ATTENTION: raw.get("rope_local_base_freq", full)}


def rope_types(raw: dict) -> set[str]:
    """The RoPE variants a config asks for (``default`` is the plain one)."""
    params = raw.get("rope_parameters") or {}
    nested = [value for value in params.values() if isinstance(value, dict)]
    found = {p.get("rope_type", p.get("type", "default")) for p in [*nested, params] if p} if params else set()
    scaling = raw.get("rope_scaling")
    if scaling:
        found.add(scaling.get("rope_type", scaling.get("type", "default")))
    return found or {"default"}
