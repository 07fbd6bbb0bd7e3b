"""Starts a cell's servers on free 127.0.0.1 ports: Vigil's ``python -m server serve`` (bench/local_server.py), or
llama.cpp's ``llama-server`` with a peer's GGUF."""

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from server.bench.end_to_end.cells import GGUF_FLAG, Peer, Server
from server.bench.local_server import LocalServer, answers_ok, free_port, stop_process

READY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Launch:
    """What every server of a run shares."""

    log_dir: Path
    vigil_flags: tuple[str, ...]  # --max-num-seqs and the user's --vigil-args
    slots: int  # llama-server's -np, as Vigil's --max-num-seqs
    slot_context: int  # tokens of llama-server's context a slot (its -c is shared by the slots)
    threads: int
    llama_server: Path | None
    llama_flags: tuple[str, ...]
    ggufs: dict[Peer, Path]


class LlamaServer:
    def __init__(self, binary: Path, gguf: Path, launch: Launch, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        context = launch.slot_context * launch.slots
        self.command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                        "-t", str(launch.threads), "-np", str(launch.slots), "-c", str(context), *launch.llama_flags]
        self._log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> None:
        """Until /health answers 200 (llama-server answers 503 while it loads the model)."""
        if answers_ok(self.process, f"{self.base_url}/health", timeout):
            return
        if self.process.poll() is not None:
            raise RuntimeError(f"llama-server exited with {exit_status(self.process.returncode)} at start-up; "
                               f"its log: {self._log_path}")
        raise TimeoutError(f"llama-server was not ready within {timeout:.0f}s; its log: {self._log_path}")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


def missing(server: Server, launch: Launch) -> str | None:
    """What this run lacks to start the server, if anything."""
    if server.peer is None:
        return None
    if launch.llama_server is None:
        return "needs --llama-server"
    return None if server.peer in launch.ggufs else f"needs {GGUF_FLAG[server.peer]}"


def exit_status(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return f"status {code}"


@contextmanager
def running(server: Server, launch: Launch, log_name: str) -> Iterator[tuple[str, list[str]]]:
    """The server's base URL and command line while it runs; stopped on leaving, however the cell ended. A
    llama-server needs what ``missing`` asks for."""
    log_path = launch.log_dir / f"{log_name}.log"
    if server.peer is None:
        vigil = LocalServer([*launch.vigil_flags, *server.vigil_flags], log_path)
        try:
            vigil.wait_ready(READY_TIMEOUT_S)
            yield vigil.base_url, [str(part) for part in vigil.process.args]
        finally:
            vigil.stop()
        return
    llama = LlamaServer(launch.llama_server, launch.ggufs[server.peer], launch, log_path)
    try:
        llama.wait_ready(READY_TIMEOUT_S)
        yield llama.base_url, llama.command
    finally:
        llama.stop()
