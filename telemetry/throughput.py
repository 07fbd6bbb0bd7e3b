"""A sliding-window rate: an amount (events, FLOPs, busy seconds) per second over the last ``window_s`` seconds."""

from collections import deque


class WindowedRate:
    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def add(self, now: float, count: float) -> None:
        if count:
            self._events.append((now, count))
            self._total += count
        self._expire(now)

    def rate(self, now: float) -> float:
        return self.total(now) / self.window_s

    def total(self, now: float) -> float:
        self._expire(now)
        return self._total

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._total -= self._events.popleft()[1]
