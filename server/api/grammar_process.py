"""The server's side of one grammar-checking worker process (``grammar_worker.py``): started on first use,
killed when a check passes its deadline, and started afresh after a crash."""

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import server

WORKER_START_TIMEOUT_S = 120.0  # a fresh interpreter, llguidance and the tokenizer, on a busy two-core machine
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class WorkerTokenizer:
    """What the worker needs to build the same llguidance tokenizer as the server."""

    json: str
    n_vocab: int
    eos: list[int]


class CheckTimedOut(Exception):
    pass


class WorkerCrashed(Exception):
    pass


class WorkerUnavailable(Exception):
    """The worker process could not be started: the server's fault, not the grammar's."""


class GrammarWorker:
    """Not thread-safe: one check at a time (``GrammarCompiler`` hands each worker to one thread)."""

    def __init__(self, tokenizer: Callable[[], WorkerTokenizer], memory_bytes: int, stack_bytes: int) -> None:
        self._tokenizer = tokenizer
        self._memory_bytes = memory_bytes
        self._stack_bytes = stack_bytes
        self._process: subprocess.Popen | None = None
        self._buffer = b""

    def check(self, kind: str, source: str, timeout_s: float) -> str | None:
        """The compile error of ``source`` or None; raises CheckTimedOut (and kills the worker) past
        ``timeout_s``, WorkerCrashed when the grammar took the worker down."""
        self._ensure_started()
        try:
            self._send({"kind": kind, "source": source})
            line = self._read_line(time.monotonic() + timeout_s)
        except (OSError, EOFError):
            self.stop()
            raise WorkerCrashed from None
        if line is None:
            self.stop()
            raise CheckTimedOut
        return json.loads(line)["error"]

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
            self._process = None
            self._buffer = b""

    def _ensure_started(self) -> None:
        if self._process is not None:
            return
        tokenizer = self._tokenizer()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "server.api.grammar_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=_worker_environment(),
        )
        try:
            self._send({"tokenizer": tokenizer.json, "n_vocab": tokenizer.n_vocab, "eos": tokenizer.eos,
                        "memory_bytes": self._memory_bytes, "stack_bytes": self._stack_bytes})
            ready = self._read_line(time.monotonic() + WORKER_START_TIMEOUT_S)
        except (OSError, EOFError):
            ready = None
        if ready is None:
            self.stop()
            raise WorkerUnavailable("the grammar worker process did not start")

    def _send(self, message: dict) -> None:
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        self._process.stdin.flush()

    def _read_line(self, deadline: float) -> bytes | None:
        """The next answer, None once ``deadline`` passes; EOFError when the worker has gone."""
        stdout = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stdout], [], [], left)[0]:
                return None
            chunk = os.read(stdout, READ_CHUNK)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


def _worker_environment() -> dict[str, str]:
    """The server's environment, with the folder that holds ``server`` first on the path, wherever it runs from."""
    root = str(Path(server.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return os.environ | {"PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}
