"""CUDA graphs of decode steps against the eager layer loop (step 3 of gpu_check/gpu_check.sh).

    python -m gpu_check.decode_graphs_gpu                 # CUDA: parity in fp32 and bf16, then a speed figure
    python -m gpu_check.decode_graphs_gpu --device cpu    # the dry run: graphs are refused there, in one line

Parity: on the bundled model, ``--decode-path cuda-graphs`` (sizes 1, 2, 4, 8, 16) and ``layer-loop`` generate
greedy tokens for batches of 1, 3 (replayed padded to 4), 8 and 13 prompts (padded to 16). A graph's block table
is as wide as the longest sequence allowed, so its decode attention may split the keys differently from the eager
step's, and the tokens may part at a near-tie: each graph token must be the eager engine's top choice given the
same prefix, or within ``MARGIN`` of it, scored by the eager engine's own prompt logprobs. Speed, reported and not
judged: output tokens/s of 128 decode steps at batch 1 and 16, each path, and the ratio.
"""

import argparse
import time

import torch

from gpu_check.checks import Checks
from gpu_check.engine_gpu import free_device_memory
from server import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6, 7,",
    "The three laws of thermodynamics are",
    "Write a haiku about autumn leaves.",
    "SELECT name FROM users WHERE",
    "In 1969, the first humans",
    "Photosynthesis converts",
    "My favourite recipe for bread starts with",
    "The quick brown fox",
    "Rust's borrow checker ensures that",
    "Dear hiring manager,",
]
BATCHES = (1, 3, 8, 13)
NUM_TOKENS = 24
MARGIN = {"float32": 1e-3, "bfloat16": 0.5}
GRAPH_SIZES = (1, 2, 4, 8, 16)


def make_llm(device: str, dtype: str, decode_path: str) -> LLM:
    return LLM(None, device=device, dtype=dtype, weight_dtype=dtype, kv_cache_dtype=dtype, decode_path=decode_path,
               max_num_seqs=GRAPH_SIZES[-1], gpu_memory_utilization=0.15)


def greedy(llm: LLM, prompts: list[str], num_tokens: int = NUM_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    return [list(output.outputs[0].token_ids) for output in llm.generate(prompts, params)]


def worst_margin(eager: LLM, prompt: str, tokens: list[int]) -> float:
    """The largest gap between the eager engine's top logprob and that of the graph's token, over its tokens."""
    prompt_ids = eager.tokenizer.encode(prompt)
    scored = eager.generate(prompt_ids + tokens, SamplingParams(max_tokens=1, prompt_logprobs=1))[0]
    entries = scored.prompt_logprobs[len(prompt_ids):]
    return max(entry.top[0][1] - entry.logprob for entry in entries)


def check_parity(checks: Checks, device: str, dtype: str) -> None:
    eager, graphs = make_llm(device, dtype, "layer-loop"), make_llm(device, dtype, "cuda-graphs")
    captured = graphs.engine.runner.decode_graphs
    checks.record(f"{dtype}: the plan's graphs are captured", captured is not None and captured.sizes == GRAPH_SIZES,
                  f"sizes {captured.sizes if captured else None}")
    for size in BATCHES:
        prompts = PROMPTS[:size]
        expected, found = greedy(eager, prompts), greedy(graphs, prompts)
        worst = max(worst_margin(eager, prompt, tokens) for prompt, tokens in zip(prompts, found, strict=True))
        same = sum(a == b for a, b in zip(expected, found, strict=True))
        checks.record(f"{dtype} batch {size}: graph tokens are the eager engine's choices", worst <= MARGIN[dtype],
                      f"worst gap {worst:.2e} (allowed {MARGIN[dtype]:.0e}); {same}/{size} sequences identical")


def decode_speed(llm: LLM, batch: int) -> float:
    prompts = (PROMPTS * 2)[:batch]
    greedy(llm, prompts, 8)  # warm: Triton's compiles and autotuning for these shapes
    torch.cuda.synchronize()
    started = time.perf_counter()
    greedy(llm, prompts, 128)
    torch.cuda.synchronize()
    return batch * 128 / (time.perf_counter() - started)


def report_speed(device: str) -> None:
    eager, graphs = make_llm(device, "bfloat16", "layer-loop"), make_llm(device, "bfloat16", "cuda-graphs")
    for batch in (1, GRAPH_SIZES[-1]):
        plain, replayed = decode_speed(eager, batch), decode_speed(graphs, batch)
        print(f"speed bf16 batch {batch}: layer-loop {plain:.0f} tok/s, cuda-graphs {replayed:.0f} tok/s, "
              f"{replayed / plain:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    device = parser.parse_args().device
    checks = Checks()
    if device == "cpu":
        try:
            make_llm(device, "float32", "cuda-graphs")
            checks.record("cuda-graphs refused off CUDA", False, "the CPU engine took it")
        except ValueError as error:
            checks.record("cuda-graphs refused off CUDA", "need a CUDA device" in str(error), str(error))
        checks.skip("graph parity and speed", "CUDA graphs need a CUDA device")
        checks.exit()
    for dtype in ("float32", "bfloat16"):
        check_parity(checks, device, dtype)
        free_device_memory()
    report_speed(device)
    checks.exit()


if __name__ == "__main__":
    main()
