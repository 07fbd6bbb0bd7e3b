"""Device-dependent engine defaults."""

import torch

from server.engine.builder import resolve_max_num_batched_tokens
from server.engine.precision import resolve_kv_cache_dtype, resolve_weight_dtype

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def test_fp16_weights_are_the_cpu_default_under_fp32_compute_only():
    assert resolve_weight_dtype("auto", torch.float32, CPU) == torch.float16
    assert resolve_weight_dtype("auto", torch.bfloat16, CPU) == torch.bfloat16
    assert resolve_weight_dtype("auto", torch.float16, CUDA) == torch.float16
    assert resolve_weight_dtype("float32", torch.float32, CPU) == torch.float32


def test_an_fp16_kv_cache_is_the_cpu_default_under_fp32_compute_only():
    assert resolve_kv_cache_dtype("auto", torch.float32, CPU) == torch.float16
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, CPU) == torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.float32, CUDA) == torch.float32
    assert resolve_kv_cache_dtype("float32", torch.float32, CPU) == torch.float32
    assert resolve_kv_cache_dtype("bfloat16", torch.float32, CPU) == torch.bfloat16


def test_the_step_token_budget_is_smaller_on_the_cpu_unless_given():
    assert resolve_max_num_batched_tokens(None, CPU) == 512
    assert resolve_max_num_batched_tokens(None, CUDA) == 2048
    assert resolve_max_num_batched_tokens(4096, CPU) == 4096
