"""``vigil top`` in a real pseudo-terminal (tmux) against a real server shows the throughput of a load, and with a
guarded console it needs --api-key."""

import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.api_server import ROOT, APIServer

KEY = "top-test-key"
WAIT_S = 90.0

pytestmark = pytest.mark.server


def load(server: APIServer, stop: threading.Event) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    while not stop.is_set():
        httpx.post(f"{server.base_url}/v1/completions", headers=auth, timeout=120,
                   json={"model": "smollm", "prompt": "Tell me about terminals", "max_tokens": 32}).raise_for_status()


def screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                          check=True).stdout


def output_tokens_per_s(text: str) -> float | None:
    found = re.search(r"output tokens/s\s+([\d.]+)", text)
    return float(found.group(1)) if found else None


def test_vigil_top_needs_the_key_of_a_guarded_console_and_shows_the_throughput_of_a_load(smollm_folder):
    server = APIServer(smollm_folder, "--api-key", KEY, "--metrics-require-api-key").wait_ready(
        {"Authorization": f"Bearer {KEY}"})
    without_key = subprocess.run([sys.executable, "-m", "server", "top", "--url", server.base_url], cwd=ROOT,
                                 capture_output=True, text=True, timeout=60)
    assert without_key.returncode == 2 and "give --api-key" in without_key.stderr
    session = f"vigil-top-{time.monotonic_ns()}"
    # tmux hands its panes LINES and COLUMNS of a default 80x24 terminal; Rich would draw to those.
    top = (f"cd {ROOT} && env -u LINES -u COLUMNS {sys.executable} -m server top --url {server.base_url} "
           f"--api-key {KEY} --interval 0.5")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "70", top], check=True)
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(server, stop))
    try:
        deadline = time.monotonic() + WAIT_S
        while "ring: 3600 rows" not in (text := screen(session)):
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        assert output_tokens_per_s(text) == 0  # idle before the load
        loader.start()
        # A whole frame (tmux may be caught mid-redraw) with tokens flowing.
        while not (output_tokens_per_s(text := screen(session)) and "ring: 3600 rows" in text):
            assert time.monotonic() < deadline, text
            time.sleep(0.25)
        assert "TTFT P50" in text and "host CPU" in text
    finally:
        stop.set()
        if loader.is_alive():
            loader.join()
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        server.stop()

