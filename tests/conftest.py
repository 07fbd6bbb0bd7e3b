import os

# The Triton interpreter must be on before any @triton.jit function is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from server.models.loader import resolve_model_folder  # noqa: E402


@pytest.fixture(scope="session")
def smollm_folder():
    """The bundled SmolLM2 GGUF, converted once into the user's cache (as `make serve` would)."""
    return resolve_model_folder(None)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, smollm_folder):
    """A tiny random Llama (2 layers, SmolLM2's tokenizer) as a Hugging Face folder: the engine's machinery,
    fast."""
    from tests.tiny_model import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), smollm_folder)


@pytest.fixture(scope="module")
def tiny_engine(tiny_folder):
    """The tiny Llama's engine in fp32 with a 16 MiB pool, one per test module: the engine's machinery, fast."""
    from server.config import EngineConfig
    from server.engine.builder import build_engine

    return build_engine(EngineConfig(model=str(tiny_folder), dtype="float32", kv_cache_memory=16 * 2**20,
                                     max_num_batched_tokens=64))


@pytest.fixture(scope="session")
def llm_fp32(smollm_folder):
    from server import LLM

    return LLM(
        model=str(smollm_folder), dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
        kv_cache_memory=256 * 2**20,
    )


@pytest.fixture(scope="session")
def hf_fp32(smollm_folder):
    import torch
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(smollm_folder, dtype=torch.float32).eval()
