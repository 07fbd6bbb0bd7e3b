"""The tokenizer a GGUF file describes in its metadata, rebuilt as a Hugging Face ``tokenizer.json``.

Two kinds: byte-level BPE (``gpt2``: SmolLM2, Qwen, Llama 3), whose merges the file lists and whose text is split
by a regex named in ``tokenizer.ggml.pre``; and sentencepiece BPE (``llama``: Gemma, Mistral, Phi-3), whose merges
are recovered from the vocabulary, ranked by score (or, for Gemma, by position), with byte fallback.
"""

from typing import Any, Protocol

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from server.models.config import UnsupportedModelError

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
SPACE = "\u2581"  # sentencepiece's visible space

# The split regexes of the byte-level pre-tokenizers llama.cpp names, as their tokenizer.json files spell them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_REGEXES = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


class Metadata(Protocol):
    def get(self, key: str, default: Any = ...) -> Any: ...


def build_tokenizer(meta: Metadata, architecture: str) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens"))
    if kind == "gpt2":
        tokenizer = _byte_level(meta, tokens)
    elif kind == "llama":
        if architecture.startswith("gemma"):
            # Gemma's files spell runs of spaces as spaces.
            tokens = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
        tokenizer = _sentencepiece(meta, architecture, tokens)
    else:
        raise UnsupportedModelError(f"GGUF tokenizer model {kind!r} is not supported: byte-level BPE ('gpt2') or "
                         "sentencepiece BPE ('llama')")
    _add_special_tokens(tokenizer, tokens, meta.get("tokenizer.ggml.token_type", []))
    return tokenizer


def tokenizer_config(meta: Metadata, context_length: int | None) -> dict[str, Any]:
    tokens: list[str] = meta.get("tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id", None)
        return None if token_id is None else tokens[token_id]

    # llama.cpp adds BOS to a sentencepiece vocabulary whose file does not say otherwise.
    add_bos = meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "pad_token": token("padding"),
        "unk_token": token("unknown"),
        "add_bos_token": bool(add_bos),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    chat_template = meta.get("tokenizer.chat_template", None)
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def _byte_level(meta: Metadata, tokens: list[str]) -> Tokenizer:
    merges = [tuple(merge.split(" ", 1)) for merge in meta.get("tokenizer.ggml.merges")]
    tokenizer = Tokenizer(models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _SPLIT_REGEXES:
        split = pre_tokenizers.Split(Regex(_SPLIT_REGEXES[pre]), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    # Other names ('default', 'gpt2', and those not reproduced here) get the GPT-2 regex, the closest general one.
    return byte_level


def _sentencepiece(meta: Metadata, architecture: str, tokens: list[str]) -> Tokenizer:
    if architecture.startswith("gemma"):
        # Gemma's scores do not follow its merge order; the order of its tokens does.
        ranks = [-float(index) for index in range(len(tokens))]
    else:
        ranks = [float(score) for score in meta.get("tokenizer.ggml.scores")]
    vocab = {token: index for index, token in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id", None)
    tokenizer = Tokenizer(models.BPE(
        vocab=vocab, merges=_merges_from_vocab(vocab, ranks), byte_fallback=True, fuse_unk=True,
        unk_token=tokens[unk_id] if unk_id is not None else None,
    ))
    decoding = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if architecture.startswith("gemma"):
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first" if prefix else "never", split=False
        )
        if prefix:
            decoding.append(decoders.Strip(content=" ", left=1))
    tokenizer.decoder = decoders.Sequence(decoding)
    return tokenizer


def _merges_from_vocab(vocab: dict[str, int], ranks: list[float]) -> list[tuple[str, str]]:
    """Every split of a piece into two pieces of the vocabulary is a merge; the better the piece's rank, the earlier
    its merges apply (ties: longer left, then longer right part first)."""
    found = []
    for piece, index in vocab.items():
        splits = [(piece[:cut], piece[cut:]) for cut in range(1, len(piece))]
        pairs = sorted((pair for pair in splits if pair[0] in vocab and pair[1] in vocab),
                       key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found += [(ranks[index], len(left), len(right), left, right) for left, right in pairs]
    found.sort(key=lambda merge: merge[:3], reverse=True)
    return [(left, right) for *_, left, right in found]


def _add_special_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens whole and special; user-defined ones (like ``<think>``) whole but not special."""
    special = [tokens[i] for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_CONTROL]
    user_defined = [tokens[i] for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in special])
    tokenizer.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in user_defined])
