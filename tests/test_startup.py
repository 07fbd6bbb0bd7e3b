"""A start that talks and compiles nothing: the server loads its install-time kernels (no compiler process ever
runs under it, even with an empty torch extensions folder), says which variant it runs, and ends its start with
one ``ready:`` line that names the URL, the model and how long the start took."""

import contextlib
import re
import time
from pathlib import Path

import httpx
import pytest

from kernels.cpu_variants import chosen_variant
from tests.api_server import APIServer

pytestmark = pytest.mark.server
COMPILERS = {"cc1plus", "c++", "g++", "gcc", "ninja", "ld", "as"}


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            parent = int(re.search(r"^PPid:\s+(\d+)", status, flags=re.MULTILINE).group(1))
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = set(), [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


def command_names(pids: set[int]) -> set[str]:
    names = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


def test_the_server_starts_on_its_install_time_kernels_and_says_when_it_is_ready(smollm_folder, tmp_path):
    server = APIServer(smollm_folder, env={"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            seen |= command_names(descendants(server.process.pid))
            try:
                if httpx.get(f"{server.base_url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert server.process.poll() is None, server.log_tail()
            time.sleep(0.05)
        time.sleep(0.5)  # the ready line follows the first 200 within one poll
        log = server.log_path.read_text()
    finally:
        server.stop()
    assert not seen & COMPILERS, seen
    assert not any(tmp_path.iterdir())
    assert f"CPU kernels: {chosen_variant().name}" in log
    [ready] = re.findall(r"ready: (\S+) \((.*?)\)", log)
    assert ready[0] == server.base_url
    model, dtype, took = ready[1].split(", ")
    assert (model, dtype) == ("smollm", "float32") and re.fullmatch(r"\d+ ms from start", took)
    assert "color_message" not in log
