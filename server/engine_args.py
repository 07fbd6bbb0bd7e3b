"""Command-line flags for the engine, shared by every subcommand that builds one."""

import argparse
import dataclasses

from server.config import (
    DECODE_PATHS,
    DTYPE_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    QUANTIZATIONS,
    EngineConfig,
    SpeculativeConfig,
    parse_bytes,
)


def add_engine_args(parser: argparse.ArgumentParser, several_models: bool = False) -> None:
    """``several_models``: ``--model`` may be repeated (serve), and the other flags apply to each model."""
    defaults = EngineConfig()
    group = parser.add_argument_group("engine")
    if several_models:
        group.add_argument("--model", action="append", default=None,
                           help="GGUF file or Hugging Face folder (default: bundled SmolLM2); repeat it to serve "
                                "several models, each with its own engine, KV pool and limits")
    else:
        group.add_argument("--model", default=None,
                           help="GGUF file or Hugging Face folder (default: bundled SmolLM2)")
    group.add_argument("--dtype", default=defaults.dtype, choices=DTYPE_CHOICES)
    group.add_argument("--weight-dtype", default=defaults.weight_dtype,
                       choices=DTYPE_CHOICES,
                       help="dtype the weight matrices are stored in; auto: float16 under float32 compute on the "
                            "CPU (fbgemm widens them to fp32, so products and sums stay fp32), else --dtype")
    group.add_argument("--kv-cache-dtype", default=defaults.kv_cache_dtype, choices=KV_CACHE_DTYPE_CHOICES,
                       help="dtype of the paged KV cache; auto: float16 under float32 compute on the CPU (twice "
                            "the tokens in the same memory, half the bytes decode attention reads; K and V are "
                            "rounded to fp16, as llama.cpp does by default), else --dtype. fp8 (= fp8_e4m3) and "
                            "fp8_e5m2 hold one byte a value, unscaled: twice the tokens again, at some accuracy; "
                            "CPU kernels only")
    group.add_argument("--device", default=defaults.device, help="auto, cpu or cuda[:N]")
    group.add_argument("--tensor-parallel-size", "-tp", type=int, default=defaults.tensor_parallel_size,
                       help="split the model's heads, MLP and vocabulary over this many processes (one per GPU on "
                            "CUDA, over NCCL; gloo on the CPU), started by the server itself or by torchrun; each "
                            "has its own KV pool of --kv-cache-memory on the CPU")
    group.add_argument("--block-size", type=int, default=defaults.block_size, choices=[8, 16, 32])
    group.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    group.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens,
                       help="token budget of one step; default 512 on the CPU, 2048 on CUDA")
    group.add_argument("--max-model-len", type=int, default=None)
    group.add_argument("--kv-cache-memory", type=parse_bytes, default=defaults.kv_cache_memory,
                       help="KV pool size on the CPU, e.g. 2GiB (each model's, when serving several)")
    group.add_argument("--gpu-memory-utilization", type=float, default=defaults.gpu_memory_utilization)
    group.add_argument("--max-queue-len", type=int, default=defaults.max_queue_len)
    group.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    group.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                       help="keep the weight matrices quantised, made at load time from any checkpoint: int8 (one "
                            "scale per output channel) or int4 (a scale and a minimum per 32 input features)")
    group.add_argument("--speculative-config", type=_speculative_config, default=None,
                       help='speculative decoding, as vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": 4, '
                            '"prompt_lookup_max": 4, "prompt_lookup_min": 2}; off by default')
    group.add_argument("--stop-on-repetition", action="store_true",
                       help="end a request whose output loops (finish_reason stop, stop_reason repetition)")
    group.add_argument("--batch-invariant", action="store_true",
                       help="a request's tokens do not depend on what else is in the batch: the same prompt and "
                            "seed give the same output alone or under load (CPU kernels, bf16 or fp32, no "
                            "quantization; slower, see docs/api.md)")
    group.add_argument("--decode-path", choices=DECODE_PATHS, default="auto",
                       help="how steps run: one-call (every layer of every step, prompts too, in one compiled "
                            "call, where the model and CPU kernels allow), cuda-graphs (decode steps' layer loop "
                            "captured in a CUDA graph per batch size at start and replayed; CUDA, one process), "
                            "layer-loop (the Python loop over the layers), or auto (one-call wherever it can, else "
                            "layer-loop); --print-plan shows the choice")
    group.add_argument("--cache-dir", default=None, help="where converted GGUF models are kept")


def _speculative_config(text: str) -> SpeculativeConfig:
    try:
        return SpeculativeConfig.parse(text)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def engine_config_from_args(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    """Every EngineConfig field from the flag of the same name, but those in ``overrides`` (one model's own
    settings when serving several): the one way flags become an EngineConfig."""
    flags = {field.name: getattr(args, field.name) for field in dataclasses.fields(EngineConfig)}
    return EngineConfig(**{**flags, **overrides})


def engine_flags(config: EngineConfig) -> list[str]:
    """The command-line flags that give ``config`` back through ``engine_config_from_args``."""
    flags: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is None:
            continue
        if field.name == "enable_prefix_caching":
            flags += [] if value else ["--no-enable-prefix-caching"]
        elif isinstance(value, bool):
            flags += [f"--{field.name.replace('_', '-')}"] if value else []
        elif isinstance(value, SpeculativeConfig):
            flags += ["--speculative-config", value.to_json()]
        else:
            flags += [f"--{field.name.replace('_', '-')}", str(value)]
    return flags
