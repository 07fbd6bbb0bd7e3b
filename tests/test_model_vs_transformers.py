"""Greedy generation on the real SmolLM2 weights matches Hugging Face transformers token for token (fp32)."""

import pytest
import torch

from server import SamplingParams

PROMPTS = [
    "The capital of France is",
    "解释量子计算的基本原理",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
]
NUM_TOKENS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)


def hf_greedy(model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    """Plain greedy decoding with transformers' KV cache; unlike generate(), it never masks EOS."""
    tokens: list[int] = []
    ids = torch.tensor([prompt_ids])
    cache = None
    with torch.inference_mode():
        for _ in range(num_tokens):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.cache
            tokens.append(int(out.logits[0, -1].argmax()))
            ids = torch.tensor([[tokens[-1]]])
    return tokens


@pytest.fixture(scope="module")
def reference_tokens(llm_fp32, hf_fp32):
    return [hf_greedy(hf_fp32, llm_fp32.tokenizer.encode(p), NUM_TOKENS) for p in PROMPTS]


def test_one_prompt_at_a_time_matches_transformers(llm_fp32, reference_tokens):
    for prompt, expected in zip(PROMPTS, reference_tokens, strict=True):
        [output] = llm_fp32.generate(prompt, GREEDY)
        assert output.outputs[0].token_ids == expected, prompt


def test_all_prompts_in_one_continuous_batch_match_transformers(llm_fp32, reference_tokens):
    lengths = {len(llm_fp32.tokenizer.encode(p)) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS), "the batch should mix prompt lengths"
    outputs = llm_fp32.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == reference_tokens


def test_the_converted_model_knows_facts(llm_fp32):
    [output] = llm_fp32.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=8))
    assert "Paris" in output.outputs[0].text
