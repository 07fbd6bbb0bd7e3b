"""``python -m server`` with a fault switch for tests: after SIGUSR1, the engine's next step raises, as a real
engine failure would. The switch lives here, patched into this process, not in the product."""

import signal
import sys

from server.__main__ import main
from server.engine.engine import LLMEngine


class EngineFault(RuntimeError):
    pass


def install_fault_switch() -> None:
    armed = False
    real_step = LLMEngine.step

    def arm(signum: int, frame: object) -> None:
        nonlocal armed
        armed = True

    def step(self: LLMEngine):
        if armed:
            raise EngineFault("the test's fault switch")
        return real_step(self)

    signal.signal(signal.SIGUSR1, arm)
    LLMEngine.step = step


if __name__ == "__main__":
    install_fault_switch()
    sys.exit(main())
