"""The offline LLM takes its arguments as vLLM's does: speculative_config as a dict (or JSON text), dtypes as torch
dtypes or vLLM's aliases; anything else is a ValueError that names the argument, never an AttributeError."""

import pytest
import torch

from server import LLM, SamplingParams
from server.config import EngineConfig, SpeculativeConfig

REPETITIVE = "one two three four five one two three four five one two three four five one two three"


def test_speculative_config_as_vllm_writes_it_runs_speculation(tiny_folder):
    llm = LLM(model=str(tiny_folder), dtype=torch.float32, kv_cache_memory=16 * 2**20,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    assert llm.engine.config.speculative_config == SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)
    plain = LLM(model=str(tiny_folder), dtype="float", kv_cache_memory=16 * 2**20)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    [speculative], [decoded] = llm.generate(REPETITIVE, greedy), plain.generate(REPETITIVE, greedy)
    assert speculative.outputs[0].token_ids == decoded.outputs[0].token_ids  # fp32: speculation changes nothing


@pytest.mark.parametrize(("given", "expected"), [
    ({"dtype": torch.bfloat16}, ("bfloat16", "auto", "auto")),
    ({"dtype": "half", "weight_dtype": torch.float32, "kv_cache_dtype": "bf16"}, ("float16", "float32", "bfloat16")),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}'}, ("auto", "auto", "auto")),
])
def test_vllm_spellings_are_taken(given, expected):
    config = EngineConfig(**given)
    assert (config.dtype, config.weight_dtype, config.kv_cache_dtype) == expected


@pytest.mark.parametrize(("speculative_config", "message"), [
    ({"method": "eagle"}, "not supported"),
    ({"num_speculative_tokens": 4, "draft_model": "x"}, "unknown keys \\['draft_model'\\]"),
    ({"num_speculative_tokens": "4"}, "the other keys integers"),
    ({"num_speculative_tokens": True}, "the other keys integers"),
    ("{not json", "speculative_config is not JSON"),
    (["ngram"], "must be a dict"),
])
def test_a_bad_speculative_config_is_a_value_error_naming_it(speculative_config, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=speculative_config)


def test_a_dtype_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="dtype must be"):
        EngineConfig(dtype=torch.int8)
