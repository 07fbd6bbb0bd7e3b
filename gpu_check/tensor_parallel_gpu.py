"""Tensor parallelism on the device: greedy tokens over several ranks equal one process's (step 5 of
gpu_check/gpu_check.sh).

    python -m gpu_check.tensor_parallel_gpu                 # CUDA: 2 GPUs (NCCL); skips with a reason on fewer
    python -m gpu_check.tensor_parallel_gpu --device cpu    # dry run: 2 ranks over gloo on the CPU

Every family's tiny random checkpoint (tests/tiny_families.py; they have 4 heads and 2 KV heads) in fp32 over 2
ranks, a batch of prompts with chunked prefill, against the same engine in one process; with 3 GPUs or more,
also the bundled SmolLM2 over 3 ranks (its 9 heads and 3 KV heads do not split over 2). Prints PASS or SKIP
lines; exits 1 on a FAIL.
"""

import argparse
import tempfile
from pathlib import Path

import torch

from gpu_check.checks import Checks
from server import LLM, SamplingParams
from server.models.loader import resolve_model_folder
from tests.tiny_families import FAMILIES, write_hf_checkpoint

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who mended his nets",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def greedy(model: str | None, device: str, size: int) -> list[list[int]]:
    memory = {"gpu_memory_utilization": 0.2} if device != "cpu" else {"kv_cache_memory": 64 * 2**20}
    llm = LLM(model, device=device, tensor_parallel_size=size, dtype="float32", weight_dtype="float32",
              kv_cache_dtype="float32", max_num_batched_tokens=16, **memory)
    try:
        return [output.outputs[0].token_ids for output in llm.generate(PROMPTS, GREEDY)]
    finally:
        if size > 1:
            llm.engine.runner.model.close()


def check(checks: Checks, name: str, model: str | None, device: str, size: int) -> None:
    expected = greedy(model, device, 1)
    checks.record(f"{name} over {size} ranks equals one process", greedy(model, device, size) == expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    checks = Checks()
    gpus = torch.cuda.device_count() if args.device != "cpu" else 0
    if args.device != "cpu" and gpus < 2:
        checks.skip("tensor parallelism", f"needs 2 GPUs, this machine has {gpus}")
        checks.exit()
    root = Path(tempfile.mkdtemp(prefix="vigil-tp-"))
    for name, family in FAMILIES.items():
        folder = write_hf_checkpoint(family, root / name, resolve_model_folder(None))
        check(checks, f"tiny {name}", str(folder), args.device, 2)
    if args.device == "cpu" or gpus >= 3:
        check(checks, "bundled SmolLM2", None, args.device, 3)
    else:
        checks.skip("bundled SmolLM2 over 3 ranks", f"needs 3 GPUs, this machine has {gpus}")
    checks.exit()


if __name__ == "__main__":
    main()
