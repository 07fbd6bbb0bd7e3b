"""What every sink of the engine's stats implements (vLLM v1's ``StatLoggerBase``)."""

from abc import ABC, abstractmethod

from server.engine.stats import StepStats


class StatLogger(ABC):
    @abstractmethod
    def record(self, stats: StepStats) -> None:
        """One engine step, on the engine thread: keep it cheap."""

    def tick(self) -> None:  # noqa: B027 - most sinks have nothing to do on the timer
        """On a background timer, so that windowed values decay and periodic output appears with no step."""
