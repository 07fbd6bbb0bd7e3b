"""A fleet on 127.0.0.1 for the end-to-end tests: Vigil replicas, each with its agent check, behind the real HAProxy
(Debian's `haproxy`) running the project's deploy/haproxy/haproxy.cfg, and a client loop that counts what it gets.

The configuration is rewritten only in its addresses, as tests/ops_stack.py rewrites the monitoring's: every
listener on 127.0.0.1 and a free port, each server line at its replica's port and agent port (a replica's own
--agent-port), the routing map copied where HAProxy can read it, no Docker DNS, and the servers the test does not
run left out.
"""

import copy
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from deploy.haproxy.rollout import ROUTING_MAP
from deploy.haproxy.runtime_api import RuntimeAPI
from server.bench.local_server import SERVER_PROGRAM, free_port
from tests.api_server import APIServer
from tests.ops_stack import INTERVAL, PROMETHEUS_CONFIG, ROOT, Daemon, wait_until

HAPROXY_DIR = ROOT / "deploy/haproxy"
HAPROXY_CONFIG = HAPROXY_DIR / "haproxy.cfg"
MAP_IN_CONTAINER = f"/usr/local/etc/haproxy/{ROUTING_MAP}"
# The ports haproxy.cfg listens on in its container: the API, and HAProxy's own metrics and stats.
FRONT_PORT, MONITORING_PORT = 8000, 8405
SERVER_UP_TIMEOUT_S = 60.0


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if not found:
        raise RuntimeError("`haproxy` is not installed: apt-get install haproxy (make test does it as root)")
    return found


@dataclass(frozen=True)
class Listeners:
    front: int
    monitoring: int
    api: int


def haproxy_config(text: str, servers: dict[str, tuple[int, int]], listeners: Listeners, map_path: Path) -> str:
    """haproxy.cfg for loopback: ``servers`` maps each server name the test runs to its (port, agent port)."""
    binds = {FRONT_PORT: listeners.front, MONITORING_PORT: listeners.monitoring}
    lines, in_resolvers = [], False
    for line in text.splitlines():
        if line.startswith("resolvers "):
            in_resolvers = True
            continue
        if in_resolvers and (not line.strip() or line[0].isspace()):
            continue
        in_resolvers = False
        line = re.sub(r"\bbind :(\d+)$", lambda match: f"bind 127.0.0.1:{binds[int(match.group(1))]}", line)
        line = re.sub(r"ipv4@127\.0\.0\.1:\d+", f"ipv4@127.0.0.1:{listeners.api}", line)
        line = line.replace(MAP_IN_CONTAINER, str(map_path)).replace(" resolvers docker", "")
        server = re.fullmatch(r"(\s+server (\S+)) \S+", line)
        if server:
            if server.group(2) not in servers:
                continue
            port, agent_port = servers[server.group(2)]
            line = f"{server.group(1)} 127.0.0.1:{port} agent-port {agent_port}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class Replica:
    """``vigil serve`` with its agent check, known to HAProxy as ``name``. ``replace()`` stops it as an orchestrator
    does (SIGTERM: it drains, then exits 0) and starts a new one on the same ports."""

    def __init__(self, name: str, model_folder: Path, *serve_args: str, program: tuple[str, ...] = SERVER_PROGRAM
                 ) -> None:
        self.name = name
        self.agent_port = free_port()
        self._model_folder = model_folder
        self._serve_args = ("--agent-port", str(self.agent_port), *serve_args)
        self._program = program
        self.server = APIServer(model_folder, *self._serve_args, program=program)
        self.generation = 1

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stop(self) -> int:
        """SIGTERM; the exit status once the replica has drained."""
        self.server.terminate()
        return self.server.wait_exit()

    def start(self) -> None:
        """A new process on the same ports, once ready."""
        self.server = APIServer(self._model_folder, *self._serve_args, program=self._program,
                                port=self.server.port).wait_ready()
        self.generation += 1

    def replace(self) -> None:
        code = self.stop()
        if code != 0:
            raise RuntimeError(f"{self.name} exited with {code} on SIGTERM:\n{self.server.log_tail()}")
        self.start()


def prometheus_config(replicas: dict[str, tuple[str, str]], haproxy: str, rule_files: list[Path]) -> dict:
    """deploy/prometheus.yml's `vigil` and `haproxy` jobs for loopback, scraped every second. ``replicas`` maps each
    replica's name to its (address, track); each target carries the labels a Kubernetes ServiceMonitor gives it
    (namespace, pod, and the track through podTargetLabels), so that the autoscalers' queries select it."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"].update(scrape_interval=INTERVAL, evaluation_interval=INTERVAL)
    config["rule_files"] = [str(path) for path in rule_files]
    del config["alerting"]
    jobs = {job["job_name"]: copy.deepcopy(job) for job in config["scrape_configs"]}
    vigil, balancer = jobs["vigil"], jobs["haproxy"]
    del vigil["dns_sd_configs"]
    vigil["static_configs"] = [
        {"targets": [address], "labels": {"namespace": "vigil", "pod": name, "app_kubernetes_io_track": track}}
        for name, (address, track) in replicas.items()
    ]
    balancer["static_configs"] = [{"targets": [haproxy]}]
    config["scrape_configs"] = [vigil, balancer]
    return config


class HAProxy(Daemon):
    def __init__(self, workdir: Path, replicas: list[Replica]) -> None:
        self.listeners = Listeners(free_port(), free_port(), free_port())
        map_path = workdir / ROUTING_MAP
        shutil.copyfile(HAPROXY_DIR / ROUTING_MAP, map_path)
        servers = {replica.name: (replica.server.port, replica.agent_port) for replica in replicas}
        config_path = workdir / "haproxy.cfg"
        config_path.write_text(haproxy_config(HAPROXY_CONFIG.read_text(), servers, self.listeners, map_path))
        check = subprocess.run([haproxy_binary(), "-c", "-q", "-f", str(config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the test's config:\n{check.stdout}{check.stderr}")
        command = [haproxy_binary(), "-db", "-f", str(config_path)]
        super().__init__("haproxy", command, self.listeners.monitoring, workdir / "haproxy.log", "/healthz")
        self.url = f"http://127.0.0.1:{self.listeners.front}"
        self.metrics_address = f"127.0.0.1:{self.listeners.monitoring}"
        self.api = RuntimeAPI(f"127.0.0.1:{self.listeners.api}")

    def wait_up(self, backend: str, *names: str, timeout: float = SERVER_UP_TIMEOUT_S) -> None:
        wait_until(
            lambda: all(self.api.server(backend, name).up for name in names),
            timeout,
            interval=0.2,
            what=lambda: f"{backend} servers {names} UP in HAProxy: {self.api.servers(backend)}",
        )

    def totals(self, backend: str) -> dict[str, int]:
        """Requests each server of ``backend`` has been sent since HAProxy started."""
        return {state.name: state.total for state in self.api.servers(backend)}


@dataclass
class ClientLoop:
    """``clients`` threads sending small completions to ``url`` one after another until stopped, at most
    ``max_requests`` in all and for at most ``max_seconds``; every answer other than a 200 counts as failed."""

    url: str
    clients: int = 4
    max_tokens: int = 16
    max_requests: int = 5000
    max_seconds: float = 300.0
    ignore_eos: bool = False
    codes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + self.max_seconds
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(self.clients)]

    @property
    def sent(self) -> int:
        return sum(self.codes.values())

    def _more(self) -> bool:
        return not self._stop.is_set() and self.sent < self.max_requests and time.monotonic() < self._deadline

    def _run(self) -> None:
        body = {"model": "smollm", "prompt": "Count to ten:", "max_tokens": self.max_tokens, "temperature": 0.0,
                "ignore_eos": self.ignore_eos}
        with httpx.Client(timeout=120) as client:
            while self._more():
                try:
                    response = client.post(f"{self.url}/v1/completions", json=body)
                    code, failure = response.status_code, response.text if response.status_code != 200 else None
                except httpx.HTTPError as error:
                    code, failure = "error", repr(error)
                with self._lock:
                    self.codes[code] += 1
                    if failure is not None:
                        self.failures.append(f"{code}: {failure[:300]}")

    def __enter__(self) -> "ClientLoop":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(150)
