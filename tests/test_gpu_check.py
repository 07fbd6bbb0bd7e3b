"""gpu_check/gpu_check.sh is not dead on arrival: its dry run on the CPU runs every step through the same Python entry
points, servers and benchmarks a GPU run uses, at small sizes, and every step passes (the NVML checks SKIP inside
their step); and a step that fails says FAIL in the summary and fails the run."""

import os
import re
import subprocess
import sys

import pytest

from tests.api_server import ROOT

STEPS = ("kernels", "engine", "decode-graphs", "api", "metrics", "offline-64", "offline-256", "serve-64",
         "tensor-parallel")


def run_check(tmp_path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "GPU_CHECK_DIR": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
                   **env}
    environment.pop("TRITON_INTERPRET", None)  # the script sets what each step needs
    return subprocess.run(["bash", "gpu_check/gpu_check.sh", "--device", "cpu"], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=2400, check=False)


def summary_rows(stdout: str) -> dict[str, str]:
    summary = stdout.split("== summary", 1)[1]
    return dict(re.findall(r"^(\S+)\s+(PASS|FAIL|SKIP)\s", summary, re.MULTILINE))


@pytest.mark.slow
@pytest.mark.server
def test_the_dry_run_passes_every_step(tmp_path):
    result = run_check(tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    assert summary_rows(result.stdout) == dict.fromkeys(STEPS, "PASS")
    assert "SKIP NVML series" in (tmp_path / "metrics.log").read_text()
    for step in STEPS:
        assert (tmp_path / f"{step}.log").stat().st_size > 0


def test_a_failing_step_is_a_fail_and_fails_the_run(tmp_path):
    result = run_check(tmp_path, PYTHON="/bin/false")
    assert result.returncode == 1
    assert summary_rows(result.stdout) == dict.fromkeys(STEPS, "FAIL")


def test_a_step_with_no_time_left_is_not_run_and_fails(tmp_path):
    result = run_check(tmp_path, GPU_CHECK_BUDGET_S="0")
    assert result.returncode == 1
    assert summary_rows(result.stdout) == dict.fromkeys(STEPS, "FAIL")
    assert "not run: the 0 s budget is spent" in result.stdout
    assert not list(tmp_path.glob("*.log"))


def test_gpu_check_steps_runs_only_the_steps_it_names(tmp_path):
    result = run_check(tmp_path, PYTHON="/bin/false", GPU_CHECK_STEPS="api tensor-parallel")
    assert result.returncode == 1
    assert summary_rows(result.stdout) == {"api": "FAIL", "tensor-parallel": "FAIL"}
    assert sorted(log.name for log in tmp_path.glob("*.log")) == ["api.log", "tensor-parallel.log"]
