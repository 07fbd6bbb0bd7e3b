"""tools/test-prerequisites.sh, which `make test` runs first: silent when the binaries are there, one line naming
the Debian packages to install when they are not and it cannot install them itself."""

import os
import shutil
import subprocess
from pathlib import Path

from dashboard_queries import ROOT

SCRIPT = ROOT / "tools/test-prerequisites.sh"


def run(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", str(SCRIPT)], capture_output=True, text=True, env={"PATH": path}, timeout=60)


def test_with_everything_installed_it_says_nothing():
    result = run(os.environ["PATH"])
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_without_the_binaries_or_apt_get_it_stops_with_one_line_naming_the_packages(tmp_path: Path):
    # A PATH with the shell tools the script uses, but neither the monitoring binaries nor apt-get.
    for tool in ("id", "sort", "tr", "sed"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    result = run(str(tmp_path))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    packages = "chromium docker-registry kubectl prometheus prometheus-alertmanager"
    assert f"sudo apt-get install {packages}`" in line
    assert "haproxy" not in line  # found in /usr/sbin, which the script adds to PATH
