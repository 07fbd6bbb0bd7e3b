"""The engine's token logprobs in OpenAI's two shapes: the completions API's parallel lists, and chat's list of
per-token objects."""

import codecs
from collections.abc import Sequence

from server.api.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from server.engine.request import TokenLogprob
from server.models.tokenizer import Tokenizer

# JSON has no -Infinity; a token that the grammar or a logit bias excludes gets this, as in OpenAI and vLLM.
LOGPROB_FLOOR = -9999.0


def finite(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; a token that is part of a UTF-8 character is written ``bytes:\\xe2\\x80``, as OpenAI
    writes it."""
    data = tokenizer.token_bytes(token_id)
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)


class CompletionLogprobsWriter:
    """Writes one choice's logprobs in the completions shape, chunk after chunk: ``text_offset`` counts the
    characters of the choice's text before each token, from ``start_offset``."""

    def __init__(self, tokenizer: Tokenizer, start_offset: int = 0) -> None:
        self._tokenizer = tokenizer
        self._offset = start_offset
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, token_ids: Sequence[int], entries: Sequence[TokenLogprob | None]) -> CompletionLogprobs:
        """``entries[i]`` is ``token_ids[i]``'s logprobs, or None where nothing predicts it (a prompt's first)."""
        result = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for token_id, entry in zip(token_ids, entries, strict=True):
            text = token_text(self._tokenizer, token_id)
            result.tokens.append(text)
            result.text_offset.append(self._offset)
            self._offset += len(self._utf8.decode(self._tokenizer.token_bytes(token_id)))
            if entry is None:
                result.token_logprobs.append(None)
                result.top_logprobs.append(None)
                continue
            result.token_logprobs.append(finite(entry.logprob))
            top = {token_text(self._tokenizer, t): finite(logprob) for t, logprob in entry.top}
            result.top_logprobs.append(top | {text: finite(entry.logprob)})
        return result


def chat_logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> ChatLogprobs:
    def top(token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(token=token_text(tokenizer, token_id), logprob=finite(logprob),
                          bytes=list(tokenizer.token_bytes(token_id)))

    content = [
        ChatTokenLogprob(**top(entry.token_id, entry.logprob).model_dump(),
                         top_logprobs=[top(t, logprob) for t, logprob in entry.top])
        for entry in entries
    ]
    return ChatLogprobs(content=content)
