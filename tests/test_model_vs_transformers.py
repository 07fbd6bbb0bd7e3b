"""Greedy generation on the real SmolLM2 weights matches Hugging Face transformers token for token: in fp32, and
with the CPU's defaults (weight matrices and KV cache in fp16, arithmetic in fp32) against transformers given the
same fp16 roundings of the weights and of K/V."""

import json
import os
import subprocess
import sys

import pytest
import torch

from kernels.cpu_variants import executable_variants
from server import SamplingParams

pytestmark = pytest.mark.slow

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
def llm_cpu_defaults(smollm_folder):
    """fp32 compute with the CPU's defaults: weight matrices in fp16 (fbgemm) and an fp16 KV cache."""
    from server import LLM

    llm = LLM(model=str(smollm_folder), dtype="float32", kv_cache_memory=64 * 2**20)
    assert llm.engine.runner.model.weight_dtype == torch.float16
    assert llm.engine.runner.kv_caches[0][0].dtype == torch.float16
    return llm


def sdpa_on_fp16_rounded_kv(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on keys and values rounded through fp16, as an fp16 KV cache holds them."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key.half().float(), value.half().float(), attention_mask, **kwargs)


@pytest.fixture(scope="module")
def hf_with_the_cpu_roundings(smollm_folder):
    """transformers in fp32 on every weight matrix rounded through fp16 (the function fbgemm's fp16-weight GEMM
    computes, up to the order of its sums), attending over K/V rounded through fp16."""
    from transformers import AttentionInterface, LlamaForCausalLM

    AttentionInterface.register("sdpa_fp16_kv", sdpa_on_fp16_rounded_kv)
    model = LlamaForCausalLM.from_pretrained(
        smollm_folder, dtype=torch.float32, attn_implementation="sdpa_fp16_kv"
    ).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.copy_(parameter.half().float())
    return model


def test_cpu_defaults_match_transformers_with_the_same_roundings(llm_cpu_defaults, hf_with_the_cpu_roundings):
    expected = [hf_greedy(hf_with_the_cpu_roundings, llm_cpu_defaults.tokenizer.encode(p), NUM_TOKENS) for p in PROMPTS]
    outputs = llm_cpu_defaults.generate(PROMPTS, GREEDY)
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


LOWEST_VARIANT_GREEDY = """
import json, sys
from server import LLM, SamplingParams
from kernels import cpu
prompts, num_tokens = json.loads(sys.argv[1]), int(sys.argv[2])
llm = LLM(model=sys.argv[3], dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
          kv_cache_memory=64 * 2**20)
outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True))
print(json.dumps([cpu.variant_name(), llm.engine.info.attention_backend, [o.outputs[0].token_ids for o in outputs]]))
"""


@pytest.mark.skipif(len(executable_variants()) < 2, reason="this CPU runs one variant only, the default")
def test_the_lowest_cpu_kernel_variant_matches_transformers(smollm_folder, reference_tokens):
    """The default (highest) variant is the one the tests above run; here VIGIL_CPU_ISA forces the lowest."""
    lowest = executable_variants()[0].name
    result = subprocess.run(
        [sys.executable, "-c", LOWEST_VARIANT_GREEDY, json.dumps(PROMPTS), str(NUM_TOKENS), str(smollm_folder)],
        env={**os.environ, "VIGIL_CPU_ISA": lowest, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True,
        timeout=600, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    variant, backend, tokens = json.loads(result.stdout.strip().splitlines()[-1])
    assert (variant, backend) == (lowest, "cpu")
    assert tokens == reference_tokens


def test_the_converted_model_knows_facts(llm_fp32):
    [output] = llm_fp32.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=8))
    assert "Paris" in output.outputs[0].text


def test_the_bf16_path_picks_transformers_choices(smollm_folder, hf_fp32):
    """In bf16 on the CPU (decoding rows go through the C++ few-rows kernel, prefills through oneDNN), every greedy
    token is fp32 transformers' top choice given the same prefix, or a near-tie within 0.5 logits that bf16's
    rounding may break the other way."""
    from gpu_check.engine_gpu import worst_margin
    from server import LLM

    llm = LLM(model=str(smollm_folder), dtype="bfloat16", kv_cache_memory=128 * 2**20)
    alone = [llm.generate([prompt], GREEDY)[0].outputs[0].token_ids for prompt in PROMPTS]
    batched = [output.outputs[0].token_ids for output in llm.generate(PROMPTS, GREEDY)]
    for prompt, one, many in zip(PROMPTS, alone, batched, strict=True):
        prompt_ids = llm.tokenizer.encode(prompt)
        assert worst_margin(hf_fp32, prompt_ids, one) <= 0.5, prompt
        assert worst_margin(hf_fp32, prompt_ids, many) <= 0.5, prompt
