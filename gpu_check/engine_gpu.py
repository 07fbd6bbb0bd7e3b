"""The engine on the device against transformers, and sampling's device paths (step 2 of gpu_check/gpu_check.sh).

    python -m gpu_check.engine_gpu                 # CUDA: the bundled model in fp32 and in bf16
    python -m gpu_check.engine_gpu --device cpu    # the same checks on the CPU, in fp32 (a dry run)

Greedy: the engine's tokens, one prompt at a time and all prompts in one batch, must be transformers' greedy
choices given the same prefix: transformers in fp32 on the same device scores the engine's output in one pass,
and each engine token must be its top token, or within ``MARGIN`` logits of it (a near-tie that the engine's
dtype may break the other way). fp32 must also match transformers' own greedy tokens exactly.

Sampling, in the engine's dtype on the device: a seed reproduces its tokens and another seed changes them, with
and without n-gram speculation; penalties change a repetitive prompt's output; a logit bias of +100 forces its
token; logprobs come back finite. Prints one PASS or FAIL line per check and exits 1 on any FAIL.
"""

import argparse
import gc
import math

import torch

from gpu_check.checks import Checks
from server import LLM, SamplingParams
from server.config import SpeculativeConfig
from server.models.loader import resolve_model_folder

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who mended his nets",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]
NUM_TOKENS = 24
MARGIN = {"float32": 1e-3, "bfloat16": 0.5}
REPETITIVE = "one two one two one two one two one two"


def make_llm(device: str, dtype: str, **extra: object) -> LLM:
    memory = {"gpu_memory_utilization": 0.2} if device != "cpu" else {"kv_cache_memory": 256 * 2**20}
    return LLM(None, device=device, dtype=dtype, weight_dtype=dtype, kv_cache_dtype=dtype, **memory, **extra)


def greedy(llm: LLM, prompts: list[str]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params)]


def reference_model(device: str):  # noqa: ANN201 - a transformers LlamaForCausalLM
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(resolve_model_folder(None), dtype=torch.float32).to(device).eval()


@torch.inference_mode()
def worst_margin(model, prompt_ids: list[int], output_ids: list[int]) -> float:
    """The largest gap between transformers' top logit and the engine's token's, over the engine's output."""
    ids = torch.tensor([prompt_ids + output_ids], device=model.device)
    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    chosen = logits.gather(1, torch.tensor(output_ids, device=model.device)[:, None])[:, 0]
    return float((logits.max(dim=1).values - chosen).max())


@torch.inference_mode()
def reference_greedy(model, prompt_ids: list[int]) -> list[int]:
    ids = torch.tensor([prompt_ids], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_TOKENS,
                         min_new_tokens=NUM_TOKENS, do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids) :].tolist()


def check_greedy(checks: Checks, device: str, dtype: str, model) -> None:
    llm = make_llm(device, dtype)
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    alone = [greedy(llm, [p])[0] for p in PROMPTS]
    batched = greedy(llm, PROMPTS)
    worst = max(worst_margin(model, ids, out) for ids, out in zip(prompt_ids, batched, strict=True))
    checks.record(f"greedy {dtype}: batched equals one at a time", batched == alone)
    checks.record(f"greedy {dtype}: transformers' choices", worst <= MARGIN[dtype],
                  f"worst gap to transformers' top logit {worst:.2e} (allowed {MARGIN[dtype]:.0e})")
    if dtype == "float32":
        expected = [reference_greedy(model, ids) for ids in prompt_ids]
        checks.record("greedy float32: token for token", batched == expected)


def sampled(llm: LLM, prompt: str, **params: object) -> list[int]:
    settings = {"temperature": 0.9, "top_p": 0.95, "top_k": 50, "max_tokens": NUM_TOKENS, "ignore_eos": True}
    return llm.generate(prompt, SamplingParams(**{**settings, **params}))[0].outputs[0].token_ids


def check_seeds(checks: Checks, llm: LLM, label: str) -> None:
    first, again, other = (sampled(llm, PROMPTS[1], seed=seed) for seed in (7, 7, 8))
    checks.record(f"{label}: a seed reproduces its tokens", first == again)
    checks.record(f"{label}: another seed changes them", first != other)


def check_sampling_params(checks: Checks, device: str, dtype: str) -> None:
    llm = make_llm(device, dtype)
    check_seeds(checks, llm, f"seeded sampling {dtype}")
    plain = greedy(llm, [REPETITIVE])[0]
    penalised = sampled(llm, REPETITIVE, temperature=0.0, repetition_penalty=1.5, presence_penalty=0.5,
                        frequency_penalty=0.5)
    checks.record("penalties change a repetitive prompt's greedy tokens", penalised != plain)
    token = llm.tokenizer.encode(" Paris")[0]
    biased = sampled(llm, PROMPTS[2], temperature=0.0, logit_bias={token: 100.0})
    checks.record("a logit bias of +100 forces its token", set(biased) == {token})
    found = llm.generate(PROMPTS[0], SamplingParams(max_tokens=4, logprobs=5, seed=1))[0].outputs[0].logprobs
    checks.record("logprobs come back finite", bool(found) and all(
        math.isfinite(entry.logprob) and len(entry.top) >= 5 for entry in found
    ))


def free_device_memory() -> None:
    """Drop the engines made so far, so that the next one sizes its KV pool from the memory they held."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = args.device
    dtypes = ["float32"] if device == "cpu" else ["float32", "bfloat16"]
    checks = Checks()
    model = reference_model(device)
    for dtype in dtypes:
        check_greedy(checks, device, dtype, model)
        free_device_memory()
    check_sampling_params(checks, device, dtypes[-1])
    free_device_memory()
    speculating = make_llm(device, dtypes[-1], speculative_config=SpeculativeConfig(num_speculative_tokens=3))
    check_seeds(checks, speculating, f"seeded sampling {dtypes[-1]} with n-gram speculation")
    checks.exit()


if __name__ == "__main__":
    main()
