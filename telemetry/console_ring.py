"""A fixed-size ring of per-second rows, one column per series: the live console's memory, bounded at start."""

import threading

import numpy as np


class SeriesRing:
    """``capacity`` rows of ``fields`` floats (NaN where a second had no value), each stamped with its second."""

    def __init__(self, fields: tuple[str, ...], capacity: int = 3600) -> None:
        self.fields = fields
        self.capacity = capacity
        self._values = np.full((capacity, len(fields)), np.nan)
        self._seconds = np.full(capacity, -1, dtype=np.int64)
        self._count = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._values.nbytes + self._seconds.nbytes

    def append(self, second: int, row: dict[str, float]) -> None:
        values = np.array([row.get(name, np.nan) for name in self.fields], dtype=np.float64)
        with self._lock:
            slot = self._count % self.capacity
            self._values[slot] = values
            self._seconds[slot] = second
            self._count += 1

    def window(self, after_second: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows stamped after ``after_second``, oldest first: their seconds, and their values (a row each)."""
        with self._lock:
            kept = min(self._count, self.capacity)
            order = (np.arange(kept) + self._count - kept) % self.capacity
            seconds = self._seconds[order]
            values = self._values[order]
        chosen = seconds > after_second
        return seconds[chosen], values[chosen]

    def since(self, after_second: int) -> tuple[list[int], dict[str, list[float | None]]]:
        """As ``window``, for JSON: each field's values as a list, None for NaN."""
        seconds, values = self.window(after_second)
        rounded = np.round(values, 6).astype(object)
        rounded[np.isnan(values)] = None
        return seconds.tolist(), dict(zip(self.fields, rounded.T.tolist(), strict=True))
