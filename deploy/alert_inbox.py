"""A local inbox for Alertmanager notifications, so that a person can watch alerts arrive.

Alertmanager posts its webhook payload to ``POST /alerts``. Each alert is printed as one line on stdout
(``docker compose logs -f alert-inbox``) and kept in memory: ``GET /`` lists them newest first in a page
that refreshes itself, ``GET /api/alerts`` returns them as JSON. The heartbeat receiver posts to
``POST /heartbeat``: the page shows when the last heartbeat came, ``GET /api/heartbeat`` returns it.
With ``--docs-dir``, ``GET /docs/NAME.md`` shows a Markdown file of that folder with an anchor on every heading,
so that the alerts' runbook links open on their section. Standard library only, so it runs in a plain python
image: ``python alert_inbox.py --host 0.0.0.0 --port 8080 --docs-dir docs``.
"""

import argparse
import collections
import html
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_KEPT = 500
MAX_BODY_BYTES = 1 << 20
# A heartbeat is expected every minute or two; older than this, the page shows it in red.
HEARTBEAT_STALE_S = 300
DOC_NAME = re.compile(r"/docs/([\w-]+\.md)")


def now() -> datetime:
    return datetime.now(UTC)


class Inbox:
    """The last ``MAX_KEPT`` alert notifications, newest first, and the last heartbeat."""

    def __init__(self) -> None:
        self._entries: collections.deque[dict] = collections.deque(maxlen=MAX_KEPT)
        self._last_heartbeat: datetime | None = None
        self._heartbeats = 0
        self._lock = threading.Lock()

    def add(self, payload: dict) -> list[dict]:
        received_at = now().isoformat(timespec="seconds")
        entries = [
            {
                "received_at": received_at,
                "receiver": payload.get("receiver", ""),
                "status": alert.get("status", payload.get("status", "")),
                "alertname": alert.get("labels", {}).get("alertname", ""),
                "severity": alert.get("labels", {}).get("severity", ""),
                "labels": alert.get("labels", {}),
                "annotations": alert.get("annotations", {}),
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

    def beat(self) -> None:
        with self._lock:
            self._last_heartbeat = now()
            self._heartbeats += 1

    def heartbeat(self) -> dict:
        """When the last heartbeat came (ISO 8601, or None), how long ago in seconds, and how many came."""
        with self._lock:
            last, count = self._last_heartbeat, self._heartbeats
        return {
            "last_received_at": last.isoformat(timespec="seconds") if last else None,
            "seconds_ago": round((now() - last).total_seconds(), 1) if last else None,
            "count": count,
        }


def link(url: str) -> str:
    return f"<a href='{html.escape(url)}'>{html.escape(url)}</a>" if url.startswith(("http://", "https://")) else ""


def render_heartbeat(heartbeat: dict) -> str:
    if heartbeat["last_received_at"] is None:
        return "<p class='stale'>No heartbeat yet: the alerting pipeline has not delivered VigilWatchdog.</p>"
    stale = heartbeat["seconds_ago"] > HEARTBEAT_STALE_S
    return (
        f"<p class='{'stale' if stale else 'alive'}'>Last heartbeat: {heartbeat['last_received_at']} "
        f"({heartbeat['seconds_ago']:.0f} s ago, {heartbeat['count']} in all).</p>"
    )


def render_page(entries: list[dict], heartbeat: dict) -> str:
    rows = "".join(
        "<tr class='{status}'><td>{received_at}</td><td>{status}</td><td>{severity}</td><td>{receiver}</td>"
        "<td><b>{alertname}</b><br>{summary}</td><td>{value}</td><td>{description}</td><td>{instance}</td>"
        "<td>{runbook}<br>{dashboard}</td></tr>".format(
            instance=html.escape(entry["labels"].get("instance", "")),
            summary=html.escape(entry["annotations"].get("summary", "")),
            value=html.escape(entry["annotations"].get("value", "")),
            description=html.escape(entry["annotations"].get("description", "")),
            runbook=link(entry["annotations"].get("runbook_url", "")),
            dashboard=link(entry["annotations"].get("dashboard_url", "")),
            **{key: html.escape(str(entry[key])) for key in ("received_at", "status", "severity", "receiver",
                                                             "alertname")},  # fmt: skip
        )
        for entry in entries
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>Vigil alert inbox</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }} table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
tr.firing td:nth-child(2) {{ color: #b00; font-weight: bold; }} tr.resolved td:nth-child(2) {{ color: #070; }}
p.stale {{ color: #b00; font-weight: bold; }} p.alive {{ color: #070; }}
</style></head><body>
<h1>Vigil alert inbox</h1>
{render_heartbeat(heartbeat)}
<p>{len(entries)} notifications from Alertmanager, newest first. This page refreshes every 5 seconds.</p>
<table><tr><th>received (UTC)</th><th>status</th><th>severity</th><th>receiver</th><th>alert</th><th>value</th>
<th>description</th><th>instance</th><th>runbook and dashboard</th></tr>{rows}</table>
</body></html>
"""


def heading_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading, so that the same runbook links work on GitHub and here."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def render_markdown(text: str, title: str) -> str:
    """The Markdown source as preformatted text, with each heading an element that carries its anchor."""
    parts, block = [], []
    for line in text.splitlines():
        heading = re.match(r"(#{1,6})\s+(.+)", line)
        if not heading:
            block.append(html.escape(line))
            continue
        if block:
            parts.append("<pre>" + "\n".join(block) + "</pre>")
            block = []
        level, words = len(heading.group(1)), heading.group(2)
        parts.append(f"<h{level} id='{heading_anchor(words)}'>{html.escape(words)}</h{level}>")
    if block:
        parts.append("<pre>" + "\n".join(block) + "</pre>")
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body { font-family: sans-serif; margin: 1.5em; max-width: 60em; } pre { white-space: pre-wrap; }"
        "</style></head><body>" + "".join(parts) + "</body></html>\n"
    )


def make_handler(inbox: Inbox, docs_dir: Path | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            doc = DOC_NAME.fullmatch(self.path)
            if self.path == "/":
                self._send(200, "text/html; charset=utf-8", render_page(inbox.entries(), inbox.heartbeat()))
            elif self.path == "/api/alerts":
                self._send(200, "application/json", json.dumps(inbox.entries()))
            elif self.path == "/api/heartbeat":
                self._send(200, "application/json", json.dumps(inbox.heartbeat()))
            elif self.path == "/healthz":
                self._send(200, "text/plain", "ok\n")
            elif doc and docs_dir is not None and (docs_dir / doc.group(1)).is_file():
                text = (docs_dir / doc.group(1)).read_text()
                self._send(200, "text/html; charset=utf-8", render_markdown(text, doc.group(1)))
            else:
                self._send(404, "text/plain", "not found\n")

        def do_POST(self) -> None:
            if self.path not in ("/alerts", "/heartbeat"):
                self._send(404, "text/plain", "not found\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, "text/plain", "payload too large\n")
                return
            try:
                payload = json.loads(self.rfile.read(length))
                entries = inbox.add(payload) if self.path == "/alerts" else []
            except (ValueError, AttributeError, TypeError) as error:
                self._send(400, "text/plain", f"not an Alertmanager webhook payload: {error}\n")
                return
            if self.path == "/heartbeat":
                inbox.beat()
            for entry in entries:
                print(
                    f"{entry['received_at']} {entry['status'].upper():8} {entry['severity']:8} "
                    f"{entry['alertname']} [{entry['labels'].get('instance', '')}] "
                    f"{entry['annotations'].get('summary', '')}",
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


def make_server(host: str, port: int, docs_dir: Path | None = None) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), make_handler(Inbox(), docs_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--docs-dir", type=Path, help="serve the Markdown files of this folder under /docs/")
    args = parser.parse_args()
    server = make_server(args.host, args.port, args.docs_dir)
    print(f"alert inbox listening on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
