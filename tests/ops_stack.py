"""Prometheus, Alertmanager and webhook receivers on 127.0.0.1, for the end-to-end test of the ops stack.

The configurations are the project's own (deploy/prometheus.yml, alerts/alertmanager.yml, alerts/rules/*.yml),
with only addresses and intervals rewritten: every address becomes 127.0.0.1 and a free port, scrapes and
rule evaluations run every second, Alertmanager groups in seconds, and the `for:` of the rules a test
exercises shrinks to seconds. Expressions, labels, routes and inhibitions stay as they are.
"""

import copy
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import yaml

from server.bench.local_server import free_port

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_CONFIG = ROOT / "deploy/prometheus.yml"
ALERTMANAGER_CONFIG = ROOT / "alerts/alertmanager.yml"
RULE_DIR = ROOT / "alerts/rules"

INTERVAL = "1s"  # scrape and rule evaluation
# Alertmanager's grouping delays, per route, instead of tens of seconds and minutes.
FAST_GROUPING = {"group_wait": "1s", "group_interval": "2s"}
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
MAX_BODY_BYTES = 1 << 20


def require_binary(*names: str) -> str:
    """The first of ``names`` on PATH; raises with the package to install when there is none."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError(
        f"none of {', '.join(names)} is on PATH: apt-get install prometheus prometheus-alertmanager "
        "(Prometheus 2.42 and Alertmanager 0.25 from Debian, as CI installs them)"
    )


def wait_until(
    condition: Callable[[], object], timeout: float, interval: float = 0.5, what: str | Callable[[], str] = ""
) -> object:
    """Poll ``condition`` until it returns something truthy, at most ``timeout`` seconds; return that.

    On time out, raise TimeoutError saying ``what`` was awaited (a callable is asked only then)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout:g}s: {what() if callable(what) else what}")
        time.sleep(interval)


# --- configuration -------------------------------------------------------------------------------------------


def rewrite_rules(target_dir: Path, fast_for: dict[str, str]) -> list[Path]:
    """Copies of alerts/rules/*.yml in ``target_dir``, with the ``for:`` of the alerts in ``fast_for`` replaced.

    Every other field of every rule, the expression first, is left exactly as it is.
    """
    unknown = set(fast_for)
    paths = []
    for source in sorted(RULE_DIR.glob("*.yml")):
        document = yaml.safe_load(source.read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") in fast_for:
                    rule["for"] = fast_for[rule["alert"]]
                    unknown.discard(rule["alert"])
        path = target_dir / source.name
        path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
        paths.append(path)
    if unknown:
        raise ValueError(f"no such alert rules: {sorted(unknown)}")
    return paths


def prometheus_config(server_address: str, alertmanager_address: str, rule_files: list[Path]) -> dict:
    """deploy/prometheus.yml for loopback: the `vigil` job scrapes ``server_address`` only.

    The other jobs (node-exporter, dcgm-exporter) and the DNS discovery of the `gpu` profile's server have
    nothing to find here; they are dropped, so that nothing is looked up outside 127.0.0.1 and no failing
    target raises a warning of its own (VigilScrapeTargetDown).
    """
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval=INTERVAL, evaluation_interval=INTERVAL)
    config["rule_files"] = [str(path) for path in rule_files]
    [alertmanagers] = config["alerting"]["alertmanagers"]
    alertmanagers["static_configs"] = [{"targets": [alertmanager_address]}]
    [vigil] = [job for job in config["scrape_configs"] if job["job_name"] == "vigil"]
    vigil = copy.deepcopy(vigil)
    vigil.pop("dns_sd_configs", None)
    vigil["static_configs"] = [{"targets": [server_address]}]
    config["scrape_configs"] = [vigil]
    return config


def alertmanager_config(critical_url: str, warning_url: str) -> dict:
    """alerts/alertmanager.yml with the critical receiver posting to ``critical_url``, the warning receiver to
    ``warning_url``, and grouping delays of seconds. The routing tree and the inhibit rules are unchanged."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    for route in config["route"]["routes"]:
        for key in FAST_GROUPING:
            if key in route:
                route[key] = FAST_GROUPING[key]
    urls = {"critical": critical_url, "warning": warning_url}
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    if set(receivers) != set(urls):
        raise ValueError(f"expected receivers {sorted(urls)}, found {sorted(receivers)}")
    for name, receiver in receivers.items():
        [webhook] = receiver["webhook_configs"]
        webhook["url"] = urls[name]
    return config


# --- webhook receivers ---------------------------------------------------------------------------------------


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it (Alertmanager's webhook payloads)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._payloads: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name=f"webhook-{name}", daemon=True
        )
        self._thread.start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= MAX_BODY_BYTES:
                    self.send_error(400, "expected a JSON body")
                    return
                try:
                    payload = json.loads(self.rfile.read(length))
                except ValueError:
                    self.send_error(400, "not JSON")
                    return
                with receiver._lock:
                    receiver._payloads.append(payload)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def payloads(self) -> list[dict]:
        with self._lock:
            return copy.deepcopy(self._payloads)

    def alerts(self, alertname: str | None = None, status: str | None = None) -> list[dict]:
        """Every alert of every payload received, each with its payload's ``receiver`` added."""
        found = []
        for payload in self.payloads():
            for alert in payload.get("alerts", []):
                labels = alert.get("labels", {})
                if alertname is not None and labels.get("alertname") != alertname:
                    continue
                if status is not None and alert.get("status") != status:
                    continue
                found.append({**alert, "receiver": payload.get("receiver")})
        return found

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(STOP_TIMEOUT_S)


# --- binaries ------------------------------------------------------------------------------------------------


class Daemon:
    """A binary run as a subprocess listening on 127.0.0.1:port, its output kept in a log file."""

    def __init__(self, name: str, command: list[str], port: int, log_path: Path, ready_path: str) -> None:
        self.name = name
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready(ready_path)

    def _wait_ready(self, path: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + path, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.name} was not ready within {START_TIMEOUT_S:g}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def get(self, path: str, **params: str) -> dict:
        response = httpx.get(self.base_url + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        if not self._log.closed:
            self._log.close()


class Prometheus(Daemon):
    def __init__(self, config: dict, workdir: Path) -> None:
        binary = require_binary("prometheus")
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
        ]
        super().__init__("prometheus", command, port, workdir / "prometheus.log", "/-/ready")

    def query(self, expr: str) -> dict:
        """The whole answer of an instant query: ``status``, and ``data`` or ``error``; never raises on a 4xx."""
        response = httpx.get(f"{self.base_url}/api/v1/query", params={"query": expr}, timeout=30)
        return response.json()

    def active_targets(self) -> list[dict]:
        return self.get("/api/v1/targets")["data"]["activeTargets"]

    def rules(self) -> list[dict]:
        return [rule for group in self.get("/api/v1/rules")["data"]["groups"] for rule in group["rules"]]

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["data"]["alerts"]


class Alertmanager(Daemon):
    def __init__(self, config: dict, workdir: Path) -> None:
        binary = require_binary("prometheus-alertmanager", "alertmanager")
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.path={workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        super().__init__("alertmanager", command, port, workdir / "alertmanager.log", "/-/ready")

    def alerts(self) -> list[dict]:
        return self.get("/api/v2/alerts")
