"""The engine's offline throughput, and Hugging Face transformers' on the same prompts, in one run."""

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from kernels.matmul_peak import measure_matmul_peak
from server.bench.machine import Machine, this_machine
from server.bench.timed import Timed
from server.engine.block_manager import hash_block
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine.request import SamplingParams
from server.engine.stats import StepStats
from server.engine_args import engine_config_from_args


@dataclass(frozen=True)
class Throughput:
    label: str
    output_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """Random token ids away from the special tokens at the start of the vocabulary."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab_size, (num, length), generator=generator).tolist()


def run_engine(engine: LLMEngine, prompts: list[list[int]], output_len: int,
               temperature: float = 0.0) -> tuple[Throughput, list[list[int]]]:
    """Every prompt to ``output_len`` tokens (greedy, or sampled at ``temperature``) in one continuous batch: the
    throughput, and each request's tokens, prompt and output, in the order the requests finished."""
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True)
    started = time.perf_counter()
    for index, prompt in enumerate(prompts):
        engine.add_request(engine.make_request(f"bench-{started}-{index}", prompt, params))
    produced = 0
    sequences: list[list[int]] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            produced += len(output.outputs[0].delta_token_ids)
            if output.finished:
                sequences.append(output.prompt_token_ids + output.outputs[0].token_ids)
    return Throughput("vigil engine", produced, time.perf_counter() - started), sequences


def time_engine(engine: LLMEngine, prompts: list[list[int]], output_len: int, temperature: float = 0.0) -> Throughput:
    return run_engine(engine, prompts, output_len, temperature)[0]


def time_block_hashing(sequences: list[list[int]], block_size: int) -> Timed:
    """The prefix cache's SHA-256 (``hash_block``) over every block these sequences filled in the KV cache (all
    their tokens but the last, which is sampled and never stored), chained as the block manager chains them: the
    run's hashing, timed apart from it."""
    hashing = Timed(hash_block)
    for tokens in sequences:
        parent = None
        for start in range(0, len(tokens) - block_size, block_size):
            parent = hashing(parent, tokens[start : start + block_size])
    return hashing


@dataclass(frozen=True)
class StepProfile:
    """What the engine's own stats say about a timed run."""

    decode_batch: int
    decode_steps: int
    decode_flops_per_second: float
    all_flops_per_second: float
    mean_kv_waste_ratio: float

    @classmethod
    def of(cls, steps: list[StepStats], decode_batch: int) -> "StepProfile":
        """Decode figures come from the steps that decode the whole batch and prefill nothing."""
        decodes = [s for s in steps if s.num_decode_seqs == decode_batch and not s.num_prefill_seqs]
        busy = [s for s in steps if s.num_scheduled_seqs]

        def flops_per_second(chosen: list[StepStats]) -> float:
            seconds = sum(s.step_duration_s for s in chosen)
            return sum(s.model_flops for s in chosen) / seconds if seconds else 0.0

        return cls(
            decode_batch=decode_batch,
            decode_steps=len(decodes),
            decode_flops_per_second=flops_per_second(decodes),
            all_flops_per_second=flops_per_second(busy),
            mean_kv_waste_ratio=sum(s.kv_cache_waste_ratio for s in decodes) / len(decodes) if decodes else 0.0,
        )


def warm_up(engine: LLMEngine, args: argparse.Namespace) -> None:
    """Every prefill and decode shape of a timed run, for a few tokens, on other prompts: first passes over new
    shapes are slow on the CPU, and prompts seen before would be served from the prefix cache."""
    other_prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed + 1_000_003)
    time_engine(engine, other_prompts, 4)


def time_transformers(model, prompts: list[list[int]], output_len: int, batch_size: int, label: str) -> Throughput:
    """On the model's device (the engine's), synchronised before the clock stops."""
    produced = 0
    started = time.perf_counter()
    for first in range(0, len(prompts), batch_size):
        batch = torch.tensor(prompts[first : first + batch_size], device=model.device)
        with torch.inference_mode():
            out = model.generate(
                batch, attention_mask=torch.ones_like(batch), max_new_tokens=output_len,
                min_new_tokens=output_len, do_sample=False, pad_token_id=0,
            )
        produced += (out.shape[1] - batch.shape[1]) * batch.shape[0]
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return Throughput(label, produced, time.perf_counter() - started)


def run(args: argparse.Namespace) -> int:
    config = engine_config_from_args(args)
    engine = build_engine(config)
    prompts = random_prompts(args.num_prompts, args.input_len, engine.vocab_size, args.seed)
    warm_up(engine, args)
    peak_before = measure_matmul_peak(engine.runner.model.dtype, engine.runner.device)
    steps: list[StepStats] = []
    engine.stats_listeners.append(steps.append)
    timed, sequences = run_engine(engine, prompts, args.output_len)
    results = [timed]
    engine.stats_listeners.clear()
    hashing = time_block_hashing(sequences, engine.cache_info.block_size)
    profile = StepProfile.of(steps, min(len(prompts), engine.config.max_num_seqs))
    # The higher of two probes, before and after: a probe that lands in a slow moment would inflate MFU.
    peak = max(peak_before, measure_matmul_peak(engine.runner.model.dtype, engine.runner.device))
    single_step_s = time_single_stream(engine, prompts[0], args.output_len)
    machine = this_machine()
    if not args.skip_hf:
        results += hf_results(args, engine, prompts)
    print(f"\nmachine: {machine.describe()}")
    print(f"engine: attention {engine.info.attention_backend}, layer ops {engine.runner.model.layer_ops.name}, "
          f"compute {engine.info.dtype}, weights {engine.info.weight_dtype}, KV cache {engine.cache_info.dtype}")
    print_table(results, engine)
    print_profile(profile, peak, engine)
    print_single_stream(single_step_s, engine, machine)
    print(f"prefix-cache block hashing (SHA-256), the run's {hashing.calls} blocks hashed again apart from it: "
          f"{hashing.seconds * 1e3:.1f} ms, {hashing.seconds / results[0].seconds:.3%} of the engine's time")
    return 0


def hf_results(args: argparse.Namespace, engine: LLMEngine, prompts: list[list[int]]) -> list[Throughput]:
    from transformers import LlamaForCausalLM

    from server.models.loader import resolve_model_folder

    folder = resolve_model_folder(engine.config.model)
    model = LlamaForCausalLM.from_pretrained(folder, dtype=engine.runner.model.dtype).to(engine.runner.device).eval()
    time_transformers(model, prompts[:1], 4, 1, "warm-up")
    batch = min(args.hf_batch_size, len(prompts))
    return [
        time_transformers(model, prompts[: args.hf_single_requests], args.output_len, 1, "transformers, batch 1"),
        time_transformers(model, prompts[:batch], args.output_len, batch, f"transformers, static batch {batch}"),
    ]


def time_single_stream(engine: LLMEngine, prompt: list[int], output_len: int) -> float:
    """The median decode step of one stream alone, in seconds."""
    steps: list[StepStats] = []
    engine.stats_listeners.append(steps.append)
    try:
        time_engine(engine, [prompt], output_len)
    finally:
        engine.stats_listeners.remove(steps.append)
    return statistics.median(s.step_duration_s for s in steps if s.num_decode_seqs == 1 and not s.num_prefill_seqs)


def weight_bytes_per_step(engine: LLMEngine) -> int:
    """What one decode step must read of the weights: every matrix once as stored (quantised or not), the output
    layer included; of the embedding table only a row."""
    model = engine.runner.model
    return model.weight_bytes - model.embed.nbytes


def print_single_stream(step_s: float, engine: LLMEngine, machine: Machine) -> None:
    weights = weight_bytes_per_step(engine)
    floor_s = weights / machine.read_bandwidth_bytes_per_second
    print(f"single stream: decode step {step_s * 1e3:.1f} ms ({1 / step_s:.1f} tok/s); weight-read floor "
          f"{floor_s * 1e3:.1f} ms ({weights / 1e6:.0f} MB at {machine.read_bandwidth_bytes_per_second / 1e9:.1f} "
          f"GB/s): {step_s / floor_s:.2f}x the floor")


def describe_engine(engine: LLMEngine) -> str:
    """The model and the dtypes it computes, keeps its weights and keeps its KV cache in, for a bench's header."""
    model = engine.runner.model
    return (f"{engine.config.model or 'bundled SmolLM2-135M-Instruct'}, {model.dtype} "
            f"(weights {model.weight_dtype}, KV cache {engine.runner.kv_caches[0][0].dtype})")


def print_table(results: list[Throughput], engine: LLMEngine) -> None:
    engine_result = results[0]
    print(f"\nbench offline: {describe_engine(engine)}, {torch.get_num_threads()} threads")
    print(f"{'':34} {'output tok/s':>12} {'tokens':>8} {'seconds':>8} {'vigil ÷ this':>13}")
    for result in results:
        ratio = engine_result.tokens_per_second / result.tokens_per_second
        print(f"{result.label:34} {result.tokens_per_second:12.1f} {result.output_tokens:8d} "
              f"{result.seconds:8.2f} {ratio:12.2f}x")


def print_profile(profile: StepProfile, peak: float, engine: LLMEngine) -> None:
    dtype = engine.runner.model.dtype
    print(f"\ntorch.mm peak in {dtype}, the higher of a probe before and after: {peak / 1e9:.1f} GFLOP/s")
    print(f"decode steps at batch {profile.decode_batch} ({profile.decode_steps} steps): "
          f"{profile.decode_flops_per_second / 1e9:.1f} GFLOP/s, MFU {profile.decode_flops_per_second / peak:.1%}")
    print(f"all steps, prefill included: {profile.all_flops_per_second / 1e9:.1f} GFLOP/s, "
          f"MFU {profile.all_flops_per_second / peak:.1%}")
    print(f"KV memory waste over those decode steps (block size {engine.cache_info.block_size}): "
          f"{profile.mean_kv_waste_ratio:.2%}")
