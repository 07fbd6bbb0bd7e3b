"""Online detection of a span of tokens repeated back to back: O(max_period) per token, a constant."""

from collections import deque


class RepetitionDetector:
    """Flags once the last ``min_repeats`` spans of some length ``p <= max_period`` are identical.

    For every period ``p`` it keeps the length of the current run of tokens equal to the token ``p`` places
    earlier; a run of ``(min_repeats - 1) * p`` such tokens is exactly ``min_repeats`` back-to-back copies of
    one span of ``p`` tokens. Spans shorter than ``min_span_tokens`` in total are ignored, so that a few
    repeated punctuation marks do not count as a loop.
    """

    def __init__(self, min_repeats: int = 4, max_period: int = 32, min_span_tokens: int = 16) -> None:
        if min_repeats < 2 or max_period < 1:
            raise ValueError("min_repeats must be >= 2 and max_period >= 1")
        self.min_repeats = min_repeats
        self.max_period = max_period
        self.min_span_tokens = min_span_tokens
        self._recent: deque[int] = deque(maxlen=max_period)
        self._runs = [0] * (max_period + 1)
        self.detected_period: int | None = None

    @property
    def detected(self) -> bool:
        return self.detected_period is not None

    def add(self, token: int) -> bool:
        """Feed the next token; True once a loop has been seen (and from then on)."""
        recent = self._recent
        for period in range(1, len(recent) + 1):
            if recent[-period] == token:
                self._runs[period] += 1
                run = self._runs[period]
                if (
                    self.detected_period is None
                    and run >= (self.min_repeats - 1) * period
                    and run + period >= self.min_span_tokens
                ):
                    self.detected_period = period
            else:
                self._runs[period] = 0
        recent.append(token)
        return self.detected


def has_repetition_loop(tokens: list[int] | tuple[int, ...], **limits: int) -> bool:
    detector = RepetitionDetector(**limits)
    return any(detector.add(t) for t in tokens)
