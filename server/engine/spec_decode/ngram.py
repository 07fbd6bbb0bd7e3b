"""Prompt-lookup (n-gram) proposals: when the last n tokens appeared before in the request's own context, guess
that what followed them then follows again. No draft model; it wins on text that repeats its context
(summaries, edits, code)."""

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class NgramIndex:
    """Where each n-gram of a growing context (n from ``min_n`` to ``max_n``) last appeared with a token after it:
    that token's position. Extended by the tokens added since the last lookup, so that a step costs a few dict
    operations a new token instead of a scan of the whole context (a scan every step cost a one-stream decode
    step 2% on text with nothing to copy, where the draft policy keeps asking)."""

    min_n: int
    max_n: int
    next_follow: int = 1
    follows: dict[tuple[int, ...], int] = field(default_factory=dict)

    def extend(self, context: Sequence[int]) -> None:
        if len(context) < self.next_follow:  # the context was cut short (a stop string): index it again
            self.next_follow, self.follows = 1, {}
        for follow in range(self.next_follow, len(context)):
            for n in range(self.min_n, min(self.max_n, follow) + 1):
                self.follows[tuple(context[follow - n : follow])] = follow
        self.next_follow = max(self.next_follow, len(context))

    def follow_of_suffix(self, context: Sequence[int]) -> int | None:
        """Where what followed the most recent earlier match of the longest suffix starts, if one matched."""
        length = len(context)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            follow = self.follows.get(tuple(context[length - n :]))
            if follow is not None:
                return follow
        return None


@dataclass
class NgramProposer:
    """Up to ``num_tokens`` guesses, from the most recent earlier match of the longest n-gram suffix (n from
    ``max_n`` down to ``min_n``). A request's index is kept between steps until ``forget``."""

    num_tokens: int
    min_n: int = 1
    max_n: int = 3
    indexes: dict[str, NgramIndex] = field(default_factory=dict, repr=False)

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                request_id: str | None = None) -> list[int]:
        """``num_tokens`` guesses at most, or the proposer's own number; ``request_id`` keeps the context's index
        for the request's next step (its tokens may only grow until then)."""
        wanted = self.num_tokens if num_tokens is None else num_tokens
        index = self.indexes.get(request_id) if request_id is not None else None
        if index is None:
            index = NgramIndex(self.min_n, self.max_n)
            if request_id is not None:
                self.indexes[request_id] = index
        index.extend(token_ids)
        follow = index.follow_of_suffix(token_ids)
        return [] if follow is None else _copy_on(token_ids, follow, wanted)

    def forget(self, request_id: str) -> None:
        self.indexes.pop(request_id, None)


def _copy_on(context: Sequence[int], follow: int, count: int) -> list[int]:
    """``count`` tokens copied from ``follow`` on. A copy that reaches the end of the context goes on with what it
    has just copied, as a loop would: in ``a b c a b`` the match of ``a b`` proposes ``c a b c ...``."""
    period = len(context) - follow
    return [int(context[follow + i % period]) for i in range(count)]
