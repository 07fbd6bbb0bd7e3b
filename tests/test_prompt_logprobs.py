"""Prompt logprobs (``echo`` with ``logprobs``): every prompt position, however the prompt is chunked or cached,
and equal to transformers' log-likelihoods at fp32."""

import pytest
import torch

from server import LLM
from server.engine.request import SamplingParams

TEXT = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital of "
        "Germany; Madrid is the capital of Spain.")
CONTEXT, CONTINUATION = "The capital of France is", " Paris, a city on the Seine."


def prompt_logprobs(llm: LLM, token_ids: list[int], top: int = 2) -> list:
    output = llm.generate(token_ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=top))[0]
    assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(token_ids)
    assert [e.token_id for e in output.prompt_logprobs[1:]] == token_ids[1:]
    return output.prompt_logprobs[1:]


@pytest.fixture(scope="module")
def tiny_llms(tiny_folder):
    """One engine computing each prompt in one step, one in chunks of 8 tokens over many steps."""
    args = {"dtype": "float32", "weight_dtype": "float32", "kv_cache_dtype": "float32",
            "kv_cache_memory": 16 * 2**20}
    return LLM(model=str(tiny_folder), **args), LLM(model=str(tiny_folder), max_num_batched_tokens=8, **args)


def test_a_prompt_chunked_over_many_steps_gets_every_position(tiny_llms):
    whole, chunked = tiny_llms
    ids = whole.tokenizer.encode(TEXT)
    assert len(ids) > 3 * 8
    expected, got = prompt_logprobs(whole, ids), prompt_logprobs(chunked, ids)
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in expected], abs=1e-5)
    assert [[t for t, _ in e.top] for e in got] == [[t for t, _ in e.top] for e in expected]


def test_a_cached_prompt_is_computed_again_for_its_logprobs(tiny_llms):
    whole, _ = tiny_llms
    ids = whole.tokenizer.encode(TEXT)
    whole.generate(ids, SamplingParams(temperature=0.0, max_tokens=1))
    again = whole.generate(ids, SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert again.num_cached_tokens > 0  # the prefix cache holds this prompt
    with_logprobs = whole.generate(ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    assert with_logprobs.num_cached_tokens == 0
    assert len(with_logprobs.prompt_logprobs) == len(ids)


def test_top_alternatives_are_the_most_likely_tokens_in_order(tiny_llms):
    whole, _ = tiny_llms
    for entry in prompt_logprobs(whole, whole.tokenizer.encode(TEXT), top=5):
        values = [logprob for _, logprob in entry.top]
        assert len(values) == 5 and values == sorted(values, reverse=True)
        assert entry.logprob <= values[0] + 1e-6


@pytest.mark.slow
def test_log_likelihood_of_a_continuation_equals_transformers_at_fp32(llm_fp32, hf_fp32):
    context = llm_fp32.tokenizer.encode(CONTEXT)
    ids = context + llm_fp32.tokenizer.encode(CONTINUATION, add_special_tokens=False)
    ours = [e.logprob for e in prompt_logprobs(llm_fp32, ids)][len(context) - 1 :]
    with torch.no_grad():
        logits = hf_fp32(torch.tensor([ids])).logits[0].float()
    theirs = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    theirs = theirs[len(context) - 1 :].tolist()
    assert len(ours) == len(theirs) == len(ids) - len(context)
    assert ours == pytest.approx(theirs, abs=1e-3)
    assert sum(ours) == pytest.approx(sum(theirs), abs=1e-3)
