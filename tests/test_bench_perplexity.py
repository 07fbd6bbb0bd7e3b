"""The benches' perplexity asks the engine for prompt logprobs as a client would: it agrees with Hugging Face
transformers on the same weights, across chunked-prefill steps, and leaves every block free."""

import math

import pytest
import torch
import torch.nn.functional as F

from server.bench.perplexity import perplexity
from server.config import EngineConfig
from server.engine.builder import build_engine
from server.engine.request import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_folder):
    """fp32 throughout, so that the only difference from transformers is the order of the arithmetic; a 48-token
    step budget, so that a 100-token text takes three prefill steps."""
    return build_engine(EngineConfig(model=str(tiny_folder), dtype="float32", weight_dtype="float32",
                                     kv_cache_dtype="float32", kv_cache_memory=16 * 2**20, max_num_batched_tokens=48))


def test_perplexity_is_transformers_cross_entropy_and_frees_every_block(engine, tiny_folder):
    from transformers import LlamaForCausalLM

    token_ids = torch.randint(1000, 49152, (100,), generator=torch.Generator().manual_seed(3)).tolist()
    model = LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([token_ids])).logits[0, :-1]
    expected = math.exp(float(F.cross_entropy(logits, torch.tensor(token_ids[1:]))))

    assert perplexity(engine, token_ids) == pytest.approx(expected, rel=1e-4)
    manager = engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_a_text_past_the_context_is_a_value_error(engine):
    with pytest.raises(ValueError, match="maximum context length"):
        perplexity(engine, [1000] * engine.max_model_len)


def test_a_busy_engine_is_refused(engine):
    engine.add_request(engine.make_request("busy", [1000, 1001], SamplingParams(max_tokens=2)))
    try:
        with pytest.raises(RuntimeError, match="idle"):
            perplexity(engine, [1000, 1001, 1002])
    finally:
        engine.abort_request("busy")
