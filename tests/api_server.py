"""Starts the real server (``python -m server serve``) as a subprocess on a free 127.0.0.1 port, for tests."""

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 60.0
# Small and fast: float32 (bf16 matmuls are slow on most CPUs), a small KV pool, a short context.
FAST_ENGINE_ARGS = ("--dtype", "float32", "--kv-cache-memory", "256MiB", "--max-model-len", "1024")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class APIServer:
    def __init__(self, model_folder: Path, *extra_args: str, env: dict[str, str] | None = None,
                 test_hooks: bool = True) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vigil-api-test-{self.port}.log"
        command = [sys.executable, "-m", "server", "serve", "--model", str(model_folder),
                   "--served-model-name", "smollm", "--host", "127.0.0.1", "--port", str(self.port),
                   *FAST_ENGINE_ARGS, *extra_args]
        # One torch thread: on a small shared machine, OpenMP threads that wait on each other behind other
        # processes make steps many times slower; one thread also leaves a core to the HTTP side and the tests.
        environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        if "VIGIL_API_KEYS" not in (env or {}):
            environment.pop("VIGIL_API_KEYS", None)
        if test_hooks:
            environment["VIGIL_ENABLE_TEST_HOOKS"] = "1"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=self._log,
                                        stderr=subprocess.STDOUT)

    def wait_ready(self, headers: dict[str, str] | None = None) -> "APIServer":
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", headers=headers, timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"the server was not ready within {READY_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def terminate(self) -> None:
        """Send SIGTERM (a graceful drain) without waiting."""
        self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout: float = STOP_TIMEOUT_S) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._log.close()

    def engine_state(self, headers: dict[str, str] | None = None) -> dict[str, int]:
        response = httpx.get(f"{self.base_url}/test/engine-state", headers=headers, timeout=10)
        response.raise_for_status()
        return response.json()

    def wait_all_blocks_free(self, timeout: float = 10.0, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Wait until no request is unfinished and every KV block is free; raises if that never happens.
        Returns how long that took, in ``seconds`` and in engine ``steps`` completed meanwhile."""
        started = time.monotonic()
        first = state = self.engine_state(headers)
        while time.monotonic() - started < timeout:
            if state["num_unfinished"] == 0 and state["num_free_blocks"] == state["num_blocks"]:
                return {"seconds": time.monotonic() - started, "steps": state["num_steps"] - first["num_steps"]}
            time.sleep(0.02)
            state = self.engine_state(headers)
        raise AssertionError(f"KV blocks still in use after {timeout}s: {state}")


_shared: APIServer | None = None


def shared_server(model_folder: Path) -> APIServer:
    """One plain server (no keys, test hooks on) for every test module that does not need its own."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = APIServer(model_folder).wait_ready()
        atexit.register(_shared.stop)
    return _shared
