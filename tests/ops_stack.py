"""Prometheus, Alertmanager and the alert inbox on 127.0.0.1, for the end-to-end test of the ops stack.

The configurations are the project's own (deploy/prometheus.yml, alerts/alertmanager.yml, alerts/rules/*.yml),
with only addresses and intervals rewritten: every address becomes 127.0.0.1 and a free port, scrapes and
rule evaluations run every second, Alertmanager groups and repeats the heartbeat in seconds, working hours
span the whole week, and the `for:` of the rules a test exercises shrinks to seconds. Vigil's replicas are
found through a file (file_sd) instead of DNS, so that a test can make one vanish as a stopped container does.
Expressions, labels, routes, receivers and inhibitions stay as they are. The receiver is the real alert
inbox (deploy/alert_inbox.py), serving docs/ as in the compose stack.
"""

import copy
import importlib.util
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from server.bench.local_server import answers_ok, free_port, stop_process

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS_CONFIG = ROOT / "deploy/prometheus.yml"
ALERTMANAGER_CONFIG = ROOT / "alerts/alertmanager.yml"
RULE_DIR = ROOT / "alerts/rules"
TEMPLATES = ROOT / "alerts/templates"
INBOX_IN_COMPOSE = "http://alert-inbox:8080"
MONITORING_JOBS = ("prometheus", "alertmanager")

INTERVAL = "1s"  # scrape and rule evaluation
# Alertmanager's delays, per route, instead of tens of seconds and minutes; the heartbeat repeats this often.
FAST_GROUPING = {"group_wait": "1s", "group_interval": "2s"}
FAST_HEARTBEAT = "2s"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


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


def prometheus_config(
    targets_file: Path, self_address: str, alertmanager_address: str, rule_files: list[Path], external_labels: dict
) -> dict:
    """deploy/prometheus.yml for loopback: the `vigil` job finds its replicas in ``targets_file`` (see
    ``write_targets``), Prometheus and Alertmanager scrape where they listen, and ``external_labels`` give the
    links' bases.

    The exporters (node-exporter, dcgm-exporter, the OTel collector) have nothing to scrape here; they are
    dropped, so that no failing target raises a warning of its own (VigilScrapeTargetDown).
    """
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval=INTERVAL, evaluation_interval=INTERVAL, external_labels=external_labels)
    config["rule_files"] = [str(path) for path in rule_files]
    [alertmanagers] = config["alerting"]["alertmanagers"]
    alertmanagers["static_configs"] = [{"targets": [alertmanager_address]}]
    jobs = {job["job_name"]: copy.deepcopy(job) for job in config["scrape_configs"]}
    vigil = jobs["vigil"]
    del vigil["dns_sd_configs"]
    vigil["file_sd_configs"] = [{"files": [str(targets_file)], "refresh_interval": INTERVAL}]
    addresses = {"prometheus": self_address, "alertmanager": alertmanager_address}
    for name in MONITORING_JOBS:
        jobs[name]["static_configs"] = [{"targets": [addresses[name]]}]
    config["scrape_configs"] = [vigil, *(jobs[name] for name in MONITORING_JOBS)]
    return config


def write_targets(path: Path, addresses: list[str]) -> None:
    """The `vigil` job's replicas, as a discovery file; an address left out vanishes as a gone container's does."""
    path.write_text(json.dumps([{"targets": addresses}] if addresses else []))


def alertmanager_config(inbox_url: str) -> dict:
    """alerts/alertmanager.yml with every inbox webhook posting to ``inbox_url`` instead of the compose stack's
    inbox, the templates found where they are, delays of seconds, and working hours all week."""
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    config["templates"] = [str(TEMPLATES / "*.tmpl")]
    for route in config["route"]["routes"]:
        route.update((key, value) for key, value in FAST_GROUPING.items() if key in route)
        if route["receiver"] == "heartbeat":
            route["repeat_interval"] = FAST_HEARTBEAT
    for interval in config["time_intervals"]:
        interval["time_intervals"] = [{}]
    for receiver in config["receivers"]:
        webhooks = receiver.get("webhook_configs", [])
        if [hook for hook in webhooks if not hook["url"].startswith(INBOX_IN_COMPOSE)]:
            raise ValueError(f"receiver {receiver['name']} posts somewhere other than the inbox")
        for hook in webhooks:
            hook["url"] = inbox_url + hook["url"].removeprefix(INBOX_IN_COMPOSE)
    return config


# --- the alert inbox ----------------------------------------------------------------------------------------


class AlertInbox:
    """deploy/alert_inbox.py's server on 127.0.0.1 in this process, read through its JSON API."""

    def __init__(self, docs_dir: Path) -> None:
        spec = importlib.util.spec_from_file_location("alert_inbox", ROOT / "deploy/alert_inbox.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self._server = module.make_server("127.0.0.1", 0, docs_dir)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="alert-inbox", daemon=True
        )
        self._thread.start()

    def alerts(self, alertname: str | None = None, status: str | None = None, receiver: str | None = None) -> list:
        """The notifications received, newest first, each with its payload's ``receiver``."""
        wanted = {"alertname": alertname, "status": status, "receiver": receiver}
        entries = httpx.get(f"{self.url}/api/alerts", timeout=10).json()
        return [entry for entry in entries if all(v is None or entry[k] == v for k, v in wanted.items())]

    def heartbeat(self) -> dict:
        return httpx.get(f"{self.url}/api/heartbeat", timeout=10).json()

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
        if answers_ok(self.process, self.base_url + path, START_TIMEOUT_S):
            return
        exited = self.process.poll() is not None
        self.stop()
        if exited:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
        raise TimeoutError(f"{self.name} was not ready within {START_TIMEOUT_S:g}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-5000:]

    def get(self, path: str, **params: str) -> dict:
        response = httpx.get(self.base_url + path, params=params, timeout=10)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)
        if not self._log.closed:
            self._log.close()


class Prometheus(Daemon):
    def __init__(self, config: dict, workdir: Path, port: int, flags: tuple[str, ...] = ()) -> None:
        binary = require_binary("prometheus")
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        command = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.external-url=http://127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--log.level=warn",
            *flags,
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
