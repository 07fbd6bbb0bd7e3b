"""Debian's chromium, headless, driven over the Chrome DevTools Protocol (a websocket, one page): enough to open a
page, read its DOM, list the requests it made, and take a screenshot."""

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from websockets.sync.client import connect

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def chromium_binary() -> str:
    """Debian's package (tools/test-prerequisites.sh installs it)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        raise RuntimeError("no chromium: run tools/test-prerequisites.sh, or apt-get install chromium")
    return binary


class HeadlessChromium:
    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="vigil-chromium-")
        self.process = subprocess.Popen(
            [chromium_binary(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--window-size={width},{height}", "--remote-debugging-port=0", f"--user-data-dir={self.profile.name}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        port = self._debugging_port()
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
                    if t["type"] == "page")
        self.socket = connect(page["webSocketDebuggerUrl"], max_size=2**26)
        self.ids = itertools.count(1)
        self.events: list[dict] = []
        self.call("Network.enable")
        self.call("Page.enable")

    def _debugging_port(self) -> int:
        active = Path(self.profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its debugging port")

    def call(self, method: str, **params: object) -> dict:
        call_id = next(self.ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def evaluate(self, expression: str) -> object:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self, path: Path) -> None:
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        """Ends chromium's whole process group: its helpers (renderers, the crash handler) outlive the browser
        process by a moment and write into the profile until they exit, which made removing it fail with
        "Directory not empty"."""
        self.socket.close()
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _group_alive(self.process.pid):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.profile.cleanup()


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
