"""LLM(...) with the bundled model, given each argument in the shapes vLLM's LLM takes: the engine's own settings
as dicts, JSON text, torch dtypes or vLLM's aliases; vLLM-only arguments that mean nothing here are taken and
dropped; those that would change the result are a ValueError that names them."""

import pytest
import torch

from server import LLM, SamplingParams
from server.config import SpeculativeConfig

SMALL = {"kv_cache_memory": 32 * 2**20}
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.mark.parametrize(("given", "field", "expected"), [
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative_config",
     SpeculativeConfig(num_speculative_tokens=2)),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'},
     "speculative_config", SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_max=3)),
    ({"dtype": torch.float32}, "dtype", "float32"),
    ({"dtype": "float"}, "dtype", "float32"),
    ({"dtype": "bfloat16"}, "dtype", "bfloat16"),
    ({"dtype": torch.bfloat16, "kv_cache_dtype": "fp8"}, "kv_cache_dtype", "fp8"),
    ({"kv_cache_dtype": torch.float32, "dtype": "float"}, "kv_cache_dtype", "float32"),
    ({"quantization": None}, "quantization", None),
    ({"quantization": "int8"}, "quantization", "int8"),
    ({"tensor_parallel_size": 1}, "tensor_parallel_size", 1),
    ({"max_model_len": 256}, "max_model_len", 256),
    ({"enable_prefix_caching": False}, "enable_prefix_caching", False),
    ({"gpu_memory_utilization": 0.5}, "gpu_memory_utilization", 0.5),
    ({"seed": 0}, "model", None),
    ({"trust_remote_code": True, "tokenizer_mode": "slow", "enforce_eager": True, "swap_space": 4,
      "enable_chunked_prefill": True, "disable_log_stats": True, "revision": None, "cpu_offload_gb": 0},
     "model", None),
])
def test_the_bundled_model_takes_each_argument_as_vllm_writes_it(given, field, expected):
    llm = LLM(**SMALL, **given)
    assert getattr(llm.engine.config, field) == expected
    [output] = llm.generate("The capital of France is", GREEDY)
    assert len(output.outputs[0].token_ids) == 3


def test_the_tokenizer_may_be_named_as_the_model_itself(smollm_folder):
    llm = LLM(model=str(smollm_folder), tokenizer=str(smollm_folder), **SMALL)
    assert llm.engine.config.model == str(smollm_folder)


def test_the_seed_makes_unseeded_sampling_reproducible():
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    first = LLM(seed=7, **SMALL).generate("Once upon a time", sampled)[0].outputs[0].token_ids
    again = LLM(seed=7, **SMALL).generate("Once upon a time", sampled)[0].outputs[0].token_ids
    assert first == again


@pytest.mark.parametrize(("given", "message"), [
    ({"tokenizer": "/elsewhere/tokenizer"}, "tokenizer='/elsewhere/tokenizer' is not supported"),
    ({"revision": "main"}, "revision='main' is not supported"),
    ({"tokenizer_revision": "v2"}, "tokenizer_revision='v2' is not supported"),
    ({"skip_tokenizer_init": True}, "skip_tokenizer_init=True is not supported"),
    ({"cpu_offload_gb": 4}, "cpu_offload_gb=4 is not supported"),
    ({"hf_overrides": {"num_hidden_layers": 1}}, "hf_overrides=.* is not supported"),
    ({"quantization": "awq"}, "quantization must be one of"),
    ({"dtype": "float64"}, "dtype must be"),
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype must be one of"),
    ({"speculative_config": {"method": "eagle"}}, "not supported"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be positive"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"seed": "7"}, "seed must be an integer"),
    ({"no_such_argument": 1}, "LLM\\(\\) has no argument 'no_such_argument'"),
])
def test_an_argument_it_cannot_honour_is_a_value_error_naming_it(given, message):
    with pytest.raises(ValueError, match=message):
        LLM(**SMALL, **given)
