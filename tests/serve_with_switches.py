"""``python -m server`` with switches for tests, patched into this process rather than built into the product:

- SIGUSR1: the engine's next step raises, as a real engine failure would;
- with HOLD_LOAD_ENV=1 in the environment, the engine's build waits for SIGUSR2, so that a test can watch the
  server while its model loads;
- with SLOW_LOAD_ENV set to a number of seconds, the engine's build first multiplies matrices for that long: C++
  work on the engine's thread, as a large model's load is.
"""

import os
import signal
import sys
import threading
import time

import torch

from server.__main__ import main
from server.engine import builder
from server.engine.engine import LLMEngine

HOLD_LOAD_ENV = "VIGIL_TEST_HOLD_LOAD"
SLOW_LOAD_ENV = "VIGIL_TEST_SLOW_LOAD_S"
# What tests.api_server.APIServer runs to get these switches.
PROGRAM = (sys.executable, "-m", "tests.serve_with_switches")


class EngineFault(RuntimeError):
    pass


def install_fault_switch() -> None:
    armed = threading.Event()
    real_step = LLMEngine.step

    def step(self: LLMEngine):
        if armed.is_set():
            raise EngineFault("the test's fault switch")
        return real_step(self)

    signal.signal(signal.SIGUSR1, lambda signum, frame: armed.set())
    LLMEngine.step = step


def install_load_hold() -> None:
    released = threading.Event()
    real_build = builder.build_engine

    def build_engine(config):
        released.wait()
        return real_build(config)

    signal.signal(signal.SIGUSR2, lambda signum, frame: released.set())
    builder.build_engine = build_engine


def install_slow_load(seconds: float) -> None:
    real_build = builder.build_engine

    def build_engine(config):
        product = torch.randn(512, 512)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            product = torch.tanh(product @ product)
        return real_build(config)

    builder.build_engine = build_engine


if __name__ == "__main__":
    install_fault_switch()
    if os.environ.get(HOLD_LOAD_ENV) == "1":
        install_load_hold()
    if SLOW_LOAD_ENV in os.environ:
        install_slow_load(float(os.environ[SLOW_LOAD_ENV]))
    sys.exit(main())
