"""A sliding-window rate: events per second over the last ``window_s`` seconds."""

from collections import deque


class WindowedRate:
    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, now: float, count: int) -> None:
        if count:
            self._events.append((now, count))
            self._total += count
        self._expire(now)

    def rate(self, now: float) -> float:
        self._expire(now)
        return self._total / self.window_s

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._total -= self._events.popleft()[1]
