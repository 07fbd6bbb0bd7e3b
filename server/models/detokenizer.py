"""Streaming detokenization: output token ids in, text deltas out."""

from collections.abc import Sequence

from server.models.tokenizer import Tokenizer

# Prompt tokens decoded in front of the first output tokens, so that e.g. a leading space decodes
# the way it would in the middle of the text.
PROMPT_CONTEXT_TOKENS = 5

# Valid UTF-8 completes within a few tokens (a character has at most 4 bytes). Text still unfinished
# after this many is invalid (e.g. a model looping on a lead byte) and is emitted as it is; this also
# bounds the decoded window, and so the cost of a step.
MAX_HELD_TOKENS = 8

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    A multibyte character split across byte-level tokens decodes to U+FFFD until all of its bytes
    are there, so text ending in U+FFFD is held back until a later token completes it.

    Each step decodes only ``ids[prefix_offset:]``: ``read_offset`` is where the last emitted text
    ended, ``prefix_offset`` where the step before it ended (context for the decoder).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add_token(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Emits what is still held back, as it is: the sequence really ended there."""
        if self._read_offset == len(self._ids):
            return ""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        held = len(self._ids) - self._read_offset
        if new_text.endswith(_REPLACEMENT_CHAR) and not final and held < MAX_HELD_TOKENS:
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
