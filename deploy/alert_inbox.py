"""A local inbox for Alertmanager notifications, so that a person can watch alerts arrive.

Alertmanager posts its webhook payload to ``POST /alerts``. Each alert is printed as one line on stdout
(``docker compose logs -f alert-inbox``) and kept in memory: ``GET /`` lists them newest first in a page
that refreshes itself, ``GET /api/alerts`` returns them as JSON. Standard library only, so it runs in a
plain python image: ``python alert_inbox.py --host 0.0.0.0 --port 8080``.
"""

import argparse
import collections
import html
import json
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_KEPT = 500
MAX_BODY_BYTES = 1 << 20


class Inbox:
    """The last ``MAX_KEPT`` alert notifications, newest first."""

    def __init__(self) -> None:
        self._entries: collections.deque[dict] = collections.deque(maxlen=MAX_KEPT)
        self._lock = threading.Lock()

    def add(self, payload: dict) -> list[dict]:
        received_at = datetime.now(UTC).isoformat(timespec="seconds")
        entries = [
            {
                "received_at": received_at,
                "receiver": payload.get("receiver", ""),
                "status": alert.get("status", payload.get("status", "")),
                "alertname": alert.get("labels", {}).get("alertname", ""),
                "severity": alert.get("labels", {}).get("severity", ""),
                "labels": alert.get("labels", {}),
                "summary": alert.get("annotations", {}).get("summary", ""),
                "description": alert.get("annotations", {}).get("description", ""),
                "runbook_url": alert.get("annotations", {}).get("runbook_url", ""),
                "starts_at": alert.get("startsAt", ""),
            }
            for alert in payload.get("alerts", [])
        ]
        with self._lock:
            self._entries.extendleft(entries)
        return entries

    def entries(self) -> list[dict]:
        with self._lock:
            return list(self._entries)


def render_page(entries: list[dict]) -> str:
    rows = "".join(
        "<tr class='{status}'><td>{received_at}</td><td>{status}</td><td>{severity}</td><td>{receiver}</td>"
        "<td><b>{alertname}</b><br>{summary}</td><td>{description}</td><td>{instance}</td>"
        "<td>{runbook_url}</td></tr>".format(
            instance=html.escape(entry["labels"].get("instance", "")),
            **{key: html.escape(str(value)) for key, value in entry.items()},
        )
        for entry in entries
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>Vigil alert inbox</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
tr.firing td:nth-child(2) {{ color: #b00; font-weight: bold; }} tr.resolved td:nth-child(2) {{ color: #070; }}
</style></head><body>
<h1>Vigil alert inbox</h1>
<p>{len(entries)} notifications from Alertmanager, newest first. This page refreshes every 5 seconds.</p>
<table><tr><th>received (UTC)</th><th>status</th><th>severity</th><th>receiver</th><th>alert</th>
<th>description</th><th>instance</th><th>runbook</th></tr>{rows}</table>
</body></html>
"""


def make_handler(inbox: Inbox) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/":
                self._send(200, "text/html; charset=utf-8", render_page(inbox.entries()))
            elif self.path == "/api/alerts":
                self._send(200, "application/json", json.dumps(inbox.entries()))
            elif self.path == "/healthz":
                self._send(200, "text/plain", "ok\n")
            else:
                self._send(404, "text/plain", "not found\n")

        def do_POST(self) -> None:
            if self.path != "/alerts":
                self._send(404, "text/plain", "not found\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, "text/plain", "payload too large\n")
                return
            try:
                payload = json.loads(self.rfile.read(length))
                entries = inbox.add(payload)
            except (ValueError, AttributeError, TypeError) as error:
                self._send(400, "text/plain", f"not an Alertmanager webhook payload: {error}\n")
                return
            for entry in entries:
                print(
                    f"{entry['received_at']} {entry['status'].upper():8} {entry['severity']:8} "
                    f"{entry['alertname']} [{entry['labels'].get('instance', '')}] {entry['summary']}",
                    flush=True,
                )
            self._send(200, "text/plain", "ok\n")

        def _send(self, code: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass  # one line per alert is printed instead of one per HTTP request

    return Handler


def make_server(host: str, port: int) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), make_handler(Inbox()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    server = make_server(args.host, args.port)
    print(f"alert inbox listening on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
