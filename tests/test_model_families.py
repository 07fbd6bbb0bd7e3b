"""Every supported family, from a Hugging Face folder and from GGUF, gives transformers' greedy tokens token for
token: one prompt at a time, all prompts in one continuous batch, and with prefill cut into chunks smaller than the
sliding windows. The checkpoints are tiny and random (tests/tiny_families.py); prompts and outputs run past the
windows of Mistral, Gemma 3 and Phi-3."""

from pathlib import Path

import pytest
import torch

from server import LLM, SamplingParams
from server.models.loader import default_model_path
from tests.test_model_vs_transformers import hf_greedy
from tests.tiny_families import FAMILIES, GEMMA3_OWN_SCALAR, WINDOW, Family, write_gguf, write_hf_checkpoint

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who mended his nets",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,",
]
NUM_TOKENS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
FP32 = {"dtype": "float32", "weight_dtype": "float32", "kv_cache_dtype": "float32", "kv_cache_memory": 16 * 2**20}
# A step budget under the window: a prompt's chunks and the window's edge fall in different places.
CHUNKED = {**FP32, "max_num_batched_tokens": WINDOW - 5}

CASES = {**FAMILIES, "gemma3-query-scalar": GEMMA3_OWN_SCALAR}
# GGUF has no field for Gemma 3's query_pre_attn_scalar; llama.cpp derives it from the shape.
GGUF_CASES = [name for name in CASES if name != "gemma3-query-scalar"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, smollm_folder) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: write_hf_checkpoint(family, root / name, smollm_folder) for name, family in CASES.items()}


@pytest.fixture(scope="module")
def expected(checkpoints) -> dict[str, list[list[int]]]:
    """transformers' greedy tokens for every prompt, by family."""
    from transformers import AutoModelForCausalLM

    tokens = {}
    for name, folder in checkpoints.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tokenizer = LLM(model=str(folder), **FP32).tokenizer
        tokens[name] = [hf_greedy(model, tokenizer.encode(p), NUM_TOKENS) for p in PROMPTS]
    return tokens


def model_path(name: str, source: str, checkpoints: dict[str, Path], tmp_path: Path) -> str:
    if source == "hf":
        return str(checkpoints[name])
    family: Family = CASES[name]
    return str(write_gguf(family, checkpoints[name], tmp_path / f"{name}.gguf", default_model_path()))


def tokens_of(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize(
    ("name", "source"), [(name, "hf") for name in CASES] + [(name, "gguf") for name in GGUF_CASES]
)
def test_family_matches_transformers(name, source, checkpoints, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("VIGIL_CACHE_DIR", str(tmp_path / "cache"))
    path = model_path(name, source, checkpoints, tmp_path)
    llm = LLM(model=path, **FP32)
    assert llm.engine.model_config.architecture == CASES[name].architecture
    lengths = {len(llm.tokenizer.encode(p)) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS) and max(lengths) + NUM_TOKENS > 2 * WINDOW

    assert [tokens_of(llm.generate(p, GREEDY))[0] for p in PROMPTS] == expected[name], "one prompt at a time"
    assert tokens_of(llm.generate(PROMPTS, GREEDY)) == expected[name], "one continuous batch"
    chunked = LLM(model=path, **CHUNKED)
    assert tokens_of(chunked.generate(PROMPTS, GREEDY)) == expected[name], "chunked prefill"
