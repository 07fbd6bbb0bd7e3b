"""Greedy generation on the real SmolLM2 weights matches Hugging Face transformers token for token, in fp32,
and with the weight matrices held in fp16 (fbgemm) against transformers on the same fp16-rounded weights."""

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


@pytest.fixture(scope="module")
def llm_fp16_weights(smollm_folder):
    from server import LLM

    return LLM(model=str(smollm_folder), dtype="float32", weight_dtype="float16", kv_cache_memory=64 * 2**20)


@pytest.fixture(scope="module")
def hf_fp16_rounded_weights(smollm_folder):
    """transformers in fp32 on every weight matrix rounded through fp16: the function fbgemm's fp16-weight GEMM
    computes, up to the order of its sums."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(smollm_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.copy_(parameter.half().float())
    return model


def test_fp16_weights_match_transformers_on_the_same_rounded_weights(llm_fp16_weights, hf_fp16_rounded_weights):
    expected = [hf_greedy(hf_fp16_rounded_weights, llm_fp16_weights.tokenizer.encode(p), NUM_TOKENS) for p in PROMPTS]
    outputs = llm_fp16_weights.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == expected


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
