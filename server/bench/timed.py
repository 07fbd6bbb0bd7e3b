"""A callable wrapped to count the calls made to it and the time spent in them, for benchmarks."""

import time
from collections.abc import Callable
from typing import Any


class Timed:
    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.seconds = 0.0
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.function(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1
