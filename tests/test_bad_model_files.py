"""A model that cannot be served stops `serve` with one line and exit status 2: an unknown architecture, a truncated
GGUF file, a corrupt safetensors file. Never a traceback, never a server left running half-loaded."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from server.models.loader import default_model_path

pytestmark = pytest.mark.server


def serve(model: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "server", "serve", "--model", str(model), "--port", "0", "--disable-telemetry",
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300, check=False,
    )


def assert_one_line_exit(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("vigil serve: error: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_unknown_architecture(tmp_path, tiny_folder):
    folder = Path(shutil.copytree(tiny_folder, tmp_path / "gpt2"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    assert_one_line_exit(serve(folder, tmp_path), "architecture 'GPT2LMHeadModel' is not supported")


def test_truncated_gguf(tmp_path):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(default_model_path().read_bytes()[: 2**20])
    assert_one_line_exit(serve(truncated, tmp_path), "may be truncated or corrupt")
    assert not list((tmp_path / "cache").glob("truncated-*")), "no converted folder is left behind"


def test_corrupt_safetensors(tmp_path, tiny_folder):
    folder = Path(shutil.copytree(tiny_folder, tmp_path / "corrupt"))
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    assert_one_line_exit(serve(folder, tmp_path), "model.safetensors cannot be read")
