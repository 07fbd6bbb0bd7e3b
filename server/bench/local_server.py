"""``python -m server serve`` as a child process on a free 127.0.0.1 port: start it, wait until it is ready, stop
it the way an orchestrator would (SIGTERM, then SIGKILL)."""

import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import httpx

STOP_TIMEOUT_S = 60.0
SERVER_PROGRAM = (sys.executable, "-m", "server")


# Ports are drawn from here up to the kernel's ephemeral range.
LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_draw = random.SystemRandom()


def free_port() -> int:
    """A free 127.0.0.1 port, none handed out before in this process, below the kernel's ephemeral range: a port
    the kernel picks can later be the source port of any outgoing connection, and a server restarted on its
    predecessor's port (a rolling restart) then failed to bind it."""
    ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0]) if EPHEMERAL_RANGE.exists() else 32768
    while True:
        port = _draw.randrange(LOWEST_PORT, ephemeral) if ephemeral > LOWEST_PORT else _any_free_port()
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def _any_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalServer:
    """``args`` are the serve flags besides --host and --port; stdout and stderr go to ``log_path``. ``program``
    is what takes the ``serve`` command line. ``port`` is a free one unless given (a replacement takes over the
    port of the server it replaces)."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        program: Sequence[str] = SERVER_PROGRAM,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [*program, "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float, headers: Mapping[str, str] | None = None) -> Self:
        """Until /readyz answers 200; raises, after stopping the server, if it exits or the time runs out."""
        if answers_ok(self.process, f"{self.base_url}/readyz", timeout, headers):
            return self
        if self.process.poll() is not None:
            raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
        tail = self.log_tail()  # before stop() closes the log
        self.stop()
        raise TimeoutError(f"the server was not ready within {timeout:.0f}s:\n{tail}")

    def log_tail(self, chars: int = 5000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def terminate(self) -> None:
        """SIGTERM, a graceful drain, without waiting."""
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


def answers_ok(process: subprocess.Popen, url: str, timeout: float,
               headers: Mapping[str, str] | None = None) -> bool:
    """Polls ``url`` until it answers 200 (True), or until the process exits or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    return False


def stop_process(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM and wait, then SIGKILL if it is still running ``timeout`` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
