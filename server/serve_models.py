"""Which models one server serves, each with its own engine settings, and its routing aliases: from ``--model``
(repeatable, each with its ``--served-model-name``) or from a ``--model-config`` TOML file:

    [[model]]                  # one engine each: its own KV pool, scheduler and limits
    name = "small"             # the name clients send as `model`
    model = "/models/smollm2"  # a Hugging Face folder or a .gguf file
    kv_cache_memory = "512MiB" # any EngineConfig field; those left out take the command line's engine flags

    [[alias]]                  # a name whose routing policy picks a model per request
    name = "auto"
    policy = "small_first"     # server/api/routing_policy.py; the other keys are the policy's settings
    small = "small"
    large = "large"
"""

import argparse
import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.config import EngineConfig, ServerConfig, parse_bytes
from server.engine_args import engine_config_from_args


@dataclass(frozen=True)
class ModelSpec:
    name: str
    engine: EngineConfig


@dataclass(frozen=True)
class AliasSpec:
    name: str
    policy: str
    settings: dict[str, Any]


@dataclass(frozen=True)
class ServedModels:
    models: list[ModelSpec]
    aliases: list[AliasSpec]

    def memory_split(self) -> str:
        """Each model's KV pool on the CPU (or its GPU memory share), for the start-up log."""
        parts = [f"{m.name}: KV {m.engine.kv_cache_memory / 2**20:.0f} MiB (CPU) or "
                 f"{m.engine.gpu_memory_utilization:.0%} of GPU memory" for m in self.models]
        total = sum(m.engine.kv_cache_memory for m in self.models) / 2**20
        return f"{'; '.join(parts)}; {total:.0f} MiB of KV pools on the CPU in all"


def served_models_from_args(args: argparse.Namespace) -> ServedModels:
    """Raises ValueError, with a message for the user, for flags that do not fit together or a bad config file."""
    paths: list[str | None] = args.model or [None]
    names: list[str] = args.served_model_name or []
    if args.model_config is not None:
        if args.model or names:
            raise ValueError("give the models either with --model/--served-model-name or in --model-config, not both")
        return _from_file(Path(args.model_config), args)
    if len(names) > len(paths):
        raise ValueError(f"{len(names)} --served-model-name for {len(paths)} --model: give one name per model")
    names += [path or ServerConfig.served_model_name for path in paths[len(names):]]
    models = [ModelSpec(name, engine_config_from_args(args, model=path))
              for name, path in zip(names, paths, strict=True)]
    return _checked(ServedModels(models, []))


def _from_file(path: Path, args: argparse.Namespace) -> ServedModels:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"--model-config {path}: {error}") from None
    unknown = set(raw) - {"model", "alias"}
    if unknown or not raw.get("model"):
        raise ValueError(f"--model-config {path}: give [[model]] tables (and optionally [[alias]] tables)")
    models = [_model_spec(table, args, path) for table in raw["model"]]
    aliases = [_alias_spec(table, path) for table in raw.get("alias", [])]
    return _checked(ServedModels(models, aliases))


def _model_spec(table: dict[str, Any], args: argparse.Namespace, path: Path) -> ModelSpec:
    settings = dict(table)
    name = settings.pop("name", None)
    if not name or "model" not in settings:
        raise ValueError(f"--model-config {path}: every [[model]] needs a name and a model")
    unknown = set(settings) - {field.name for field in dataclasses.fields(EngineConfig)}
    if unknown:
        raise ValueError(f"--model-config {path}: model {name!r} has unknown settings {', '.join(sorted(unknown))}")
    if "kv_cache_memory" in settings:
        settings["kv_cache_memory"] = parse_bytes(settings["kv_cache_memory"])
    return ModelSpec(name, engine_config_from_args(args, **settings))


def _alias_spec(table: dict[str, Any], path: Path) -> AliasSpec:
    settings = dict(table)
    name, policy = settings.pop("name", None), settings.pop("policy", "small_first")
    if not name:
        raise ValueError(f"--model-config {path}: every [[alias]] needs a name")
    return AliasSpec(name, policy, settings)


def _checked(served: ServedModels) -> ServedModels:
    names = [m.name for m in served.models] + [a.name for a in served.aliases]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"served model and alias names must differ: {', '.join(duplicates)} given twice")
    return served
