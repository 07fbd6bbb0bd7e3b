"""Text <-> token ids and chat prompts, from a Hugging Face folder's tokenizer files.

The underlying ``tokenizers.Tokenizer`` is safe to call from several threads at once.
"""

import functools
import json
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Texts longer than two chunks are counted a chunk at a time before they are tokenized whole, so that one far past
# the context costs only about a context's worth of tokenizing. A cut (at a space where there is one) can change
# the count by a few tokens; each cut is allowed that many.
COUNT_CHUNK_CHARS = 16384
TOKENS_A_CUT_MAY_CHANGE = 8


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        add_bos_token: bool = False,
    ) -> None:
        self._backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.bos_token_id: int | None = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id: int | None = backend.token_to_id(eos_token) if eos_token else None
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.all_special_ids: set[int] = {
            token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special
        }
        self.chat_template = chat_template
        self._compiled_template = _compile_chat_template(chat_template) if chat_template else None

    @classmethod
    def from_folder(cls, folder: Path) -> "Tokenizer":
        folder = Path(folder)
        config_path = folder / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        return cls(
            tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")),
            chat_template=_find_chat_template(folder, config),
            bos_token=_token_content(config.get("bos_token")),
            eos_token=_token_content(config.get("eos_token")),
            add_bos_token=bool(config.get("add_bos_token", False)),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # The tokenizer.json post-processor adds what the model's authors configured (e.g. Llama 3's
        # BOS); add_bos_token (tokenizer_config.json) adds a BOS on top only if it is not there yet.
        ids = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        wants_bos = add_special_tokens and self.add_bos_token and self.bos_token_id is not None
        if wants_bos and (not ids or ids[0] != self.bos_token_id):
            ids.insert(0, self.bos_token_id)
        return ids

    def long_text_exceeds(self, text: str, limit: int) -> bool:
        """Whether a text longer than two chunks surely takes more than ``limit`` tokens, found without tokenizing
        much past the limit. A shorter text is cheap to tokenize whole, and its whole count decides: False."""
        if len(text) <= 2 * COUNT_CHUNK_CHARS:
            return False
        counted = 0
        for chunk in _chunks(text, COUNT_CHUNK_CHARS):
            counted += len(self._backend.encode(chunk, add_special_tokens=False).ids) - TOKENS_A_CUT_MAY_CHANGE
            if counted > limit:
                return True
        return False

    def to_json(self) -> str:
        """The tokenizer.json text, for libraries that build their own view of the vocabulary."""
        return self._backend.to_str()

    @property
    def template_takes_tools(self) -> bool:
        """The chat template renders ``tools`` and assistant ``tool_calls`` itself."""
        return self.chat_template is not None and "tools" in self.chat_template

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (a byte-level piece may be part of a UTF-8 character)."""
        return self._token_bytes[token_id]

    @functools.cached_property
    def _token_bytes(self) -> list[bytes]:
        pieces = self._backend.get_vocab(with_added_tokens=True)
        table = [b""] * (max(pieces.values()) + 1)
        byte_level = _is_byte_level(self._backend)
        added = {token.content for token in self._backend.get_added_tokens_decoder().values()}
        for piece, token_id in pieces.items():
            table[token_id] = _piece_bytes(piece, byte_level and piece not in added)
        return table

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token can decode to: its vocabulary entry is at least that long (a byte-level
        or SentencePiece piece stands for one character or less per character of its own)."""
        return max(len(piece) for piece in self._backend.get_vocab(with_added_tokens=True))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        if self._compiled_template is None:
            raise ValueError("This model has no chat template; send a plain completion prompt instead.")
        return self._compiled_template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )


def _compile_chat_template(source: str) -> jinja2.Template:
    # The same environment settings as Hugging Face, so that templates written for it render identically.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _find_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # the older named-templates form: [{"name": ..., "template": ...}]
        named = {entry["name"]: entry["template"] for entry in template}
        template = named.get("default")
    if template:
        return template
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    json_file = folder / "chat_template.json"
    if json_file.is_file():
        return json.loads(json_file.read_text()).get("chat_template")
    return None


def _token_content(token: str | dict | None) -> str | None:
    # tokenizer_config.json writes special tokens either as plain strings or as AddedToken dicts.
    if isinstance(token, dict):
        return token.get("content")
    return token


def _is_byte_level(backend: tokenizers.Tokenizer) -> bool:
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
    return "ByteLevel" in kinds


# GPT-2's byte-level alphabet: each byte is written as one printable character.
def _byte_level_alphabet() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}


_BYTE_OF_CHAR = _byte_level_alphabet()


def _piece_bytes(piece: str, byte_level: bool) -> bytes:
    if byte_level and all(char in _BYTE_OF_CHAR for char in piece):
        return bytes(_BYTE_OF_CHAR[char] for char in piece)
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # SentencePiece byte fallback
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode()


def _chunks(text: str, size: int) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut before a space where the piece's last half has
    one."""
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            space = text.rfind(" ", start + size // 2, end)
            end = space if space > start else end
        yield text[start:end]
        start = end
