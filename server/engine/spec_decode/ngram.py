"""Prompt-lookup (n-gram) proposals: when the last n tokens appeared before in the request's own context, guess
that what followed them then follows again. No draft model; it wins on text that repeats its context
(summaries, edits, code)."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class NgramProposer:
    """Up to ``num_tokens`` guesses, from the most recent earlier match of the longest n-gram suffix (n from
    ``max_n`` down to ``min_n``)."""

    num_tokens: int
    min_n: int = 1
    max_n: int = 3

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None) -> list[int]:
        """``num_tokens`` guesses at most, or the proposer's own number."""
        wanted = self.num_tokens if num_tokens is None else num_tokens
        context = np.asarray(token_ids, dtype=np.int64)
        length = len(context)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = context[length - n :]
            # Windows that start before the suffix itself, so that what follows a match is known.
            windows = np.lib.stride_tricks.sliding_window_view(context[: length - 1], n)
            starts = np.flatnonzero((windows == suffix).all(axis=1))
            if len(starts):
                return _copy_on(context, int(starts[-1]) + n, wanted)
        return []


def _copy_on(context: np.ndarray, follow: int, count: int) -> list[int]:
    """``count`` tokens copied from ``follow`` on. A copy that reaches the end of the context goes on with what it
    has just copied, as a loop would: in ``a b c a b`` the match of ``a b`` proposes ``c a b c ...``."""
    period = len(context) - follow
    return [int(context[follow + i % period]) for i in range(count)]
