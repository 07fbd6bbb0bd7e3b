"""Tokenizers rebuilt from GGUF metadata against transformers' own GGUF reader, on text that tells the split rules
apart (digits, contractions, runs of spaces and newlines, non-Latin scripts): byte-level BPE under each
pre-tokenizer name the converter knows. (Sentencepiece is checked on the real Gemma 3 file in
test_gemma3_270m.py.)"""

from pathlib import Path

import gguf
import pytest

from server.models.gguf_tokenizer import build_tokenizer
from server.models.loader import default_model_path

TEXTS = [
    "The year 2024 had 366 days, didn't it?",
    "  two spaces,\n\n\ttabs and\r\nnewlines   ",
    "We'll see: 1234567 + 89 = ?",
    "解释量子计算的基本原理 and Émile's café ☕",
    "<|im_start|>user\nHi<|im_end|>",
]


class Metadata:
    def __init__(self, reader: gguf.GGUFReader) -> None:
        self.fields = reader.fields

    def get(self, key, default=...):
        if key not in self.fields:
            if default is ...:
                raise KeyError(key)
            return default
        return self.fields[key].contents()


@pytest.fixture(scope="module")
def smollm_tokenizer_fields() -> dict:
    fields = gguf.GGUFReader(str(default_model_path())).fields
    return {key: fields[key].contents() for key in fields if key.startswith("tokenizer.ggml.")}


@pytest.mark.parametrize("pre", ["smollm", "qwen2", "llama-bpe", "gpt2"])
def test_byte_level_tokenizers_match_transformers(pre, smollm_tokenizer_fields, tmp_path: Path):
    from transformers import AutoTokenizer

    path = tmp_path / f"{pre}.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(smollm_tokenizer_fields["tokenizer.ggml.tokens"])
    writer.add_token_types(smollm_tokenizer_fields["tokenizer.ggml.token_type"])
    writer.add_token_merges(smollm_tokenizer_fields["tokenizer.ggml.merges"])
    writer.add_bos_token_id(smollm_tokenizer_fields["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(smollm_tokenizer_fields["tokenizer.ggml.eos_token_id"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours = build_tokenizer(Metadata(gguf.GGUFReader(str(path))), "qwen2")
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], (pre, text)
        assert ours.decode(ids, skip_special_tokens=False) == text
