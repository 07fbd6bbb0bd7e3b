"""Start-up errors of the command line: a one-line message and exit status 2, never a traceback."""

import os
import socket
import subprocess
import sys

import pytest

from server.api.app import ENGINE_JOIN_TIMEOUT_S
from tests.serve_with_switches import PROGRAM, SLOW_LOAD_ENV

pytestmark = pytest.mark.server


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--kv-cache-memory", "1KiB", "hello"], "no room for a single KV block"),
        (["serve", "--model", "/nonexistent/model.gguf"], "not found"),
        (["generate", "--max-num-seqs", "0", "hello"], "max_num_seqs must be positive"),
        # The bundled SmolLM2 has 9 attention heads and 3 KV heads.
        (["serve", "--tensor-parallel-size", "2"], "--tensor-parallel-size 2 does not divide the model's 9 attention "
                                                   "heads and 3 KV heads"),
        # Without 0.5 and 2 the latency SLO pages see no slow request (a 10 s TTFT fired nothing).
        (["serve", "--latency-buckets", "0.1,1,5,10"], "must include the latency SLOs' thresholds 0.5, 2"),
        (["serve", "--console-requests", "0"], "argument --console-requests: must be at least 1, got 0"),
    ],
)
def test_bad_start_up_exits_2_with_one_line(argv: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 2
    assert f"vigil {argv[0]}: error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_port_in_use_ends_the_start_with_uvicorns_status_even_while_the_model_still_loads() -> None:
    """The bind fails while the engine's thread is still in C++ (a load longer than the shutdown's wait for it):
    the process leaves with status 3 and the error in its log, not SIGABRT from C++'s exit handlers under that
    thread."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*PROGRAM, "serve", "--host", "127.0.0.1", "--port", str(port)], capture_output=True, text=True,
            timeout=120, check=False, env={**os.environ, SLOW_LOAD_ENV: str(ENGINE_JOIN_TIMEOUT_S + 5)},
        )
    output = result.stdout + result.stderr
    assert result.returncode == 3, output[-2000:]
    assert "address already in use" in output
    assert "terminate called" not in output and "Traceback" not in output
