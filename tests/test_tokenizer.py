"""Tokenizer (built from the bundled GGUF's metadata) and the streaming detokenizer.

The GGUF is converted into the same session cache dir as test_loader.py uses, so a full run
converts it once.
"""

import json
import shutil
from pathlib import Path

import jinja2
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from server.models.detokenizer import MAX_HELD_TOKENS, IncrementalDetokenizer
from server.models.loader import resolve_model_folder
from server.models.tokenizer import Tokenizer

SYSTEM_PROMPT = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="session")
def converted_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_model_folder(None, cache_dir=tmp_path_factory.getbasetemp() / "vigil-cache")


@pytest.fixture(scope="session")
def tokenizer(converted_folder: Path) -> Tokenizer:
    return Tokenizer.from_folder(converted_folder)


@pytest.fixture()
def chat_prompt_ids(tokenizer: Tokenizer) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}]))


def copy_tokenizer_folder(source: Path, target: Path, config: dict) -> Path:
    target.mkdir()
    shutil.copy(source / "tokenizer.json", target / "tokenizer.json")
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


# --- special tokens and vocabulary -------------------------------------------------------------


@pytest.mark.parametrize(("token", "token_id"), [("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)])
def test_special_tokens_encode_to_single_ids(tokenizer: Tokenizer, token: str, token_id: int) -> None:
    assert tokenizer.encode(token) == [token_id]
    assert tokenizer.encode(f"a{token}b") == [tokenizer.encode("a")[0], token_id, tokenizer.encode("b")[0]]
    assert tokenizer.decode([token_id], skip_special_tokens=False) == token


def test_vocabulary_and_special_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_id == 2
    assert tokenizer.all_special_ids == set(range(17))


def test_no_bos_is_added_for_smollm2(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("Hello")[0] != tokenizer.bos_token_id


def test_add_bos_token_prepends_bos_once(converted_folder: Path) -> None:
    backend = tokenizers.Tokenizer.from_file(str(converted_folder / "tokenizer.json"))
    tokenizer = Tokenizer(backend, bos_token="<|im_start|>", add_bos_token=True)
    assert tokenizer.encode("Hello") == [1, *backend.encode("Hello").ids]
    assert tokenizer.encode("<|im_start|>Hello") == [1, *backend.encode("Hello").ids]
    assert tokenizer.encode("Hello", add_special_tokens=False) == backend.encode("Hello").ids


# --- encode / decode ---------------------------------------------------------------------------

ROUND_TRIP_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Version 3.14159 released on 2024-12-31, costs $1,000,000",
    "解释量子计算的基本原理",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 and ❤️",
    "  leading, \t tabs\t\tand\n\nnewlines   \r\n trailing  ",
    " Mixed 日本語 text with émigrés and naïve façades 🤖",
]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_encode_decode_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert len(ids) > 1
    assert tokenizer.decode(ids) == text


def test_digits_are_split_one_per_token(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("year 2024")
    assert [tokenizer.decode([i]) for i in ids][-4:] == ["2", "0", "2", "4"]
    assert len(tokenizer.encode("1234567890")) == 10


def test_decode_skips_special_tokens_unless_asked(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>")
    assert tokenizer.decode(ids) == "assistant\nHi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>assistant\nHi<|im_end|>"


def test_transformers_reads_the_same_tokenizer_from_the_folder(tokenizer: Tokenizer, converted_folder: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(converted_folder)
    assert (reference.bos_token, reference.eos_token, reference.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    for text in [*ROUND_TRIP_TEXTS, "<|im_start|>user\nhi<|im_end|>"]:
        assert tokenizer.encode(text) == reference(text)["input_ids"]
    messages = [{"role": "user", "content": "hi"}]
    expected = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected


# --- chat template -----------------------------------------------------------------------------


def test_chat_template_adds_the_default_system_prompt(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == SYSTEM_PROMPT + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_keeps_a_given_system_prompt(tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )


def test_model_without_chat_template_raises(converted_folder: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer_folder(converted_folder, tmp_path / "plain", {"eos_token": "<|im_end|>"})
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_folder(folder).apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("file_name", ["chat_template.jinja", "chat_template.json"])
def test_chat_template_from_a_separate_file(converted_folder: Path, tmp_path: Path, file_name: str) -> None:
    folder = copy_tokenizer_folder(converted_folder, tmp_path / "model", {"bos_token": "<|im_start|>"})
    template = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]\n{% endfor %}"
    content = json.dumps({"chat_template": template}) if file_name.endswith(".json") else template
    (folder / file_name).write_text(content)
    prompt = Tokenizer.from_folder(folder).apply_chat_template([{"role": "user", "content": "a"}])
    assert prompt == "<|im_start|>[a]\n"  # trim_blocks drops the newline after a block tag


def test_chat_template_can_raise_exception(converted_folder: Path, tmp_path: Path) -> None:
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    folder = copy_tokenizer_folder(converted_folder, tmp_path / "model", {"chat_template": template})
    tokenizer = Tokenizer.from_folder(folder)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(jinja2.TemplateError, match="user first"):
        tokenizer.apply_chat_template([{"role": "system", "content": "x"}])


# --- incremental detokenizer -------------------------------------------------------------------


def stream(tokenizer: Tokenizer, prompt_ids: list[int], ids: list[int], **kwargs) -> tuple[list[str], str]:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, **kwargs)
    deltas = [detokenizer.add_token(token_id) for token_id in ids]
    deltas.append(detokenizer.flush())
    return deltas, "".join(deltas)


@pytest.mark.parametrize("text", [*ROUND_TRIP_TEXTS, " Paris", "量子😀"])
def test_deltas_concatenate_to_the_full_decode(tokenizer: Tokenizer, chat_prompt_ids: list[int], text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, full = stream(tokenizer, chat_prompt_ids, ids)
    assert full == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_a_split_character_is_held_back_until_complete(tokenizer: Tokenizer, chat_prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("😀", add_special_tokens=False)
    assert len(ids) > 1  # byte-level pieces
    detokenizer = IncrementalDetokenizer(tokenizer, chat_prompt_ids)
    assert [detokenizer.add_token(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]


def test_flush_emits_an_unfinished_character_as_it_is(tokenizer: Tokenizer, chat_prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("ok😀", add_special_tokens=False)[:-1]
    detokenizer = IncrementalDetokenizer(tokenizer, chat_prompt_ids)
    streamed = "".join(detokenizer.add_token(i) for i in ids)
    assert streamed == "ok"
    flushed = detokenizer.flush()
    assert streamed + flushed == tokenizer.decode(ids)
    assert flushed.endswith("\ufffd")
    assert detokenizer.flush() == ""


def test_special_tokens_are_skipped_or_kept(tokenizer: Tokenizer, chat_prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("Hi there<|im_end|>", add_special_tokens=False)
    assert stream(tokenizer, chat_prompt_ids, ids)[1] == "Hi there"
    assert stream(tokenizer, chat_prompt_ids, ids, skip_special_tokens=False)[1] == "Hi there<|im_end|>"


MIXED_PIECES = [
    *"abcXYZ019 ,.!?\n\t",
    *"解释量子计算的基本原理你好世界日本語",
    "é",
    "ß",
    "€",
    "😀",
    "🎉",
    "👍🏽",
    "👨‍👩‍👧",
    "🇫🇷",
]


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.sampled_from(MIXED_PIECES), min_size=1, max_size=40))
def test_streaming_random_mixed_text_never_shows_broken_characters(tokenizer: Tokenizer, pieces: list[str]) -> None:
    text = "".join(pieces)
    prompt_ids = tokenizer.encode("<|im_start|>assistant\n")
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, full = stream(tokenizer, prompt_ids, ids)
    assert full == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_each_step_decodes_a_bounded_window(
    tokenizer: Tokenizer, chat_prompt_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded_lengths: list[int] = []
    decode = tokenizer.decode

    def counting_decode(ids, skip_special_tokens=True):
        decoded_lengths.append(len(ids))
        return decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tokenizer.encode(" ".join(ROUND_TRIP_TEXTS) * 20, add_special_tokens=False)
    assert len(ids) > 1000
    monkeypatch.setattr(tokenizer, "decode", counting_decode)
    deltas, _ = stream(tokenizer, chat_prompt_ids, ids)
    monkeypatch.undo()

    assert "".join(deltas) == tokenizer.decode(ids)
    assert len(decoded_lengths) <= 2 * (len(ids) + 1)
    assert max(decoded_lengths) <= 2 * MAX_HELD_TOKENS


def test_invalid_utf8_is_not_held_forever(tokenizer: Tokenizer, chat_prompt_ids: list[int]) -> None:
    lead_bytes = tokenizer.encode("😀", add_special_tokens=False)[0]  # never completed below
    detokenizer = IncrementalDetokenizer(tokenizer, chat_prompt_ids)
    deltas = [detokenizer.add_token(lead_bytes) for _ in range(4 * MAX_HELD_TOKENS)]
    assert "".join(deltas)  # emitted (as U+FFFD) before the end of the request
    assert set("".join(deltas)) == {"\ufffd"}
