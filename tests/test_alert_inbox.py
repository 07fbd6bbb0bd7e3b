"""The demo's alert inbox (deploy/alert_inbox.py), run in-process on 127.0.0.1: notifications, the heartbeat, and
the docs it serves so that the alerts' runbook links open on their section."""

import importlib.util
import json
import re
import threading
import urllib.error
import urllib.request

import pytest
from dashboard_queries import ROOT, alert_rules

FIRING = {
    "receiver": "critical",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {"alertname": "VigilServerDown", "severity": "critical", "instance": "vigil:8000"},
            "annotations": {
                "summary": "Vigil at vigil:8000 is down <b>",
                "value": "up = 0",
                "runbook_url": "http://127.0.0.1:8025/docs/runbook.md#vigilserverdown",
                "dashboard_url": "javascript:alert(1)",
            },
            "startsAt": "2026-01-01T00:00:00Z",
        }
    ],
}


@pytest.fixture
def inbox_url():
    spec = importlib.util.spec_from_file_location("alert_inbox", ROOT / "deploy/alert_inbox.py")
    alert_inbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alert_inbox)
    server = alert_inbox.make_server("127.0.0.1", 0, ROOT / "docs")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def test_the_inbox_shows_each_notification_with_its_value_and_links(inbox_url, capsys):
    assert post(f"{inbox_url}/alerts", json.dumps(FIRING).encode()) == 200
    [entry] = json.loads(get(f"{inbox_url}/api/alerts")[1])
    assert (entry["alertname"], entry["severity"], entry["receiver"], entry["status"]) == (
        "VigilServerDown", "critical", "critical", "firing"
    )  # fmt: skip
    assert entry["annotations"]["value"] == "up = 0"
    page = get(f"{inbox_url}/")[1]
    assert "VigilServerDown" in page and "is down &lt;b&gt;" in page and "up = 0" in page
    assert "<a href='http://127.0.0.1:8025/docs/runbook.md#vigilserverdown'>" in page
    assert "javascript:" not in page, "only http(s) links become links"
    assert "FIRING" in capsys.readouterr().out
    assert post(f"{inbox_url}/alerts", b"not json") == 400
    assert post(f"{inbox_url}/other", b"{}") == 404


def test_heartbeats_are_counted_apart_from_the_alerts(inbox_url):
    assert json.loads(get(f"{inbox_url}/api/heartbeat")[1]) == {"last_received_at": None, "seconds_ago": None,
                                                                 "count": 0}  # fmt: skip
    assert "No heartbeat yet" in get(f"{inbox_url}/")[1]
    beat = {"receiver": "heartbeat", "status": "firing", "alerts": [{"labels": {"alertname": "VigilWatchdog"}}]}
    for _ in range(2):
        assert post(f"{inbox_url}/heartbeat", json.dumps(beat).encode()) == 200
    heartbeat = json.loads(get(f"{inbox_url}/api/heartbeat")[1])
    assert heartbeat["count"] == 2 and heartbeat["seconds_ago"] >= 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", heartbeat["last_received_at"])
    assert f"Last heartbeat: {heartbeat['last_received_at']}" in get(f"{inbox_url}/")[1]
    assert json.loads(get(f"{inbox_url}/api/alerts")[1]) == []


def test_the_runbook_served_has_an_anchor_for_every_alert(inbox_url):
    status, page = get(f"{inbox_url}/docs/runbook.md")
    assert status == 200
    anchors = set(re.findall(r"<h\d id='([\w-]+)'>", page))
    assert {rule["alert"].lower() for _, rule in alert_rules()} <= anchors


@pytest.mark.parametrize("path", ["/docs/../pyproject.toml", "/docs/missing.md", "/docs/runbook.txt", "/docs/"])
def test_only_markdown_files_of_the_docs_folder_are_served(inbox_url, path):
    assert get(f"{inbox_url}{path}")[0] == 404
