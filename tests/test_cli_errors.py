"""Start-up errors of the command line: a one-line message and exit status 2, never a traceback."""

import subprocess
import sys

import pytest

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
    ],
)
def test_bad_start_up_exits_2_with_one_line(argv: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 2
    assert f"vigil {argv[0]}: error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
