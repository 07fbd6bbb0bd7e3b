"""Headless Chromium opens /console on a real server under a small bounded load: every chart gets points, no
figure reads NaN or undefined, the table lists the requests sent, and the page asks nothing of any other host.

Set VIGIL_CONSOLE_SCREENSHOT to a path to keep the screenshot (docs/console.png is one)."""

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.api_server import APIServer
from tests.headless_chromium import HeadlessChromium

REQUESTS = 8
CONCURRENCY = 2
WAIT_S = 60.0

pytestmark = pytest.mark.server


def complete(base_url: str, index: int) -> str:
    response = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
        "model": "smollm", "prompt": f"Request {index} of the console test: once upon a time", "max_tokens": 24})
    response.raise_for_status()
    return response.json()["id"]


def wait_for(browser: HeadlessChromium, expression: str, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not browser.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"the console never showed {what}")
        time.sleep(0.25)


def test_the_console_shows_every_panel_and_the_requests_sent_without_leaving_the_server(smollm_folder, tmp_path):
    server = APIServer(smollm_folder, "--log-requests").wait_ready()
    browser = HeadlessChromium()
    try:
        browser.call("Page.navigate", url=f"{server.base_url}/console")
        wait_for(browser, "!!document.body && Number(document.body.dataset.updates || 0) >= 2", "a first update")
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            ids = list(pool.map(lambda i: complete(server.base_url, i), range(REQUESTS)))
        wait_for(browser, f"document.querySelectorAll('#requests tbody tr').length >= {REQUESTS}", "every request")
        wait_for(browser, "[...document.querySelectorAll('.chart')].every(c => Number(c.dataset.points) > 0)",
                 "points in every chart")
        browser.screenshot(tmp_path / "console.png")
        if os.environ.get("VIGIL_CONSOLE_SCREENSHOT"):
            shutil.copy(tmp_path / "console.png", Path(os.environ["VIGIL_CONSOLE_SCREENSHOT"]))

        points = browser.evaluate("Object.fromEntries([...document.querySelectorAll('.chart')]"
                                  ".map(c => [c.dataset.chart, Number(c.dataset.points)]))")
        panels = browser.evaluate("[...document.querySelectorAll('.panel')].map(p => [p.id, "
                                  "p.querySelectorAll('.chart').length])")
        assert all(count > 0 for _, count in panels), panels
        assert {"requests", "ttft", "itl", "kv", "tokens", "cpu", "memory"} <= set(points), points
        assert all(count > 0 for count in points.values()), points
        text = browser.evaluate("document.body.innerText")
        assert "NaN" not in text and "undefined" not in text and "Infinity" not in text
        listed = browser.evaluate("[...document.querySelectorAll('#requests tbody tr')].map(r => r.dataset.requestId)")
        assert all(any(row.startswith(sent) for row in listed) for sent in ids), (ids, listed)
        assert browser.evaluate("document.getElementById('ring').textContent").startswith("ring: 3600 rows")
        foreign = [url for url in browser.requested_urls() if not url.startswith(server.base_url)]
        assert browser.requested_urls() and not foreign, foreign
    finally:
        browser.close()
        server.stop()
