"""deploy/haproxy/haproxy.cfg checked by the real HAProxy binary, kept in step with rollout.py and compose.yaml, and
the end-to-end test's rewrite of it shown to change addresses only."""

import re
import shlex
import subprocess
import sys

import pytest
import yaml

from deploy.haproxy.rollout import BACKENDS, GREEN_PERCENT_KEY, ROUTING_MAP
from deploy.haproxy.runtime_api import RuntimeAPI
from server.config import ServerConfig
from tests.fleet import (
    HAPROXY_CONFIG,
    HAPROXY_DIR,
    MAP_IN_CONTAINER,
    HAProxy,
    Listeners,
    haproxy_binary,
    haproxy_config,
)
from tests.ops_stack import ROOT

CONFIG = HAPROXY_CONFIG.read_text()


def sections(text: str) -> dict[str, list[str]]:
    """'backend blue' -> its lines, stripped, without comments."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            current = found.setdefault(line.strip(), [])
        else:
            current.append(line.strip())
    return found


def test_haproxy_accepts_the_config(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.replace(MAP_IN_CONTAINER, str(HAPROXY_DIR / ROUTING_MAP)))
    result = subprocess.run([haproxy_binary(), "-c", "-q", "-f", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_backend_balances_by_load_and_hears_each_replicas_agent():
    found = sections(CONFIG)
    assert {f"backend {name}" for name in BACKENDS} == {name for name in found if name.startswith("backend ")}
    for name in BACKENDS:
        lines = found[f"backend {name}"]
        assert "balance leastconn" in lines
        assert "option httpchk GET /readyz" in lines
        [default] = [line for line in lines if line.startswith("default-server ")]
        words = default.split()
        # The agent's percentage is of the configured weight: 100 makes it the weight itself.
        assert words[words.index("weight") + 1] == "100"
        assert "agent-check" in words and words[words.index("agent-port") + 1] == "8001"
        assert "check" in words
        # All of HAProxy's connections come from one address: under a replica's per-client cap.
        assert int(words[words.index("maxconn") + 1]) < ServerConfig().max_connections_per_client


def test_requests_a_replica_refused_are_retried_on_another():
    defaults = sections(CONFIG)["defaults"]
    assert "option redispatch 1" in defaults
    [retry_on] = [line for line in defaults if line.startswith("retry-on ")]
    assert {"conn-failure", "empty-response", "503"} <= set(retry_on.split()[1:])
    assert "option http-buffer-request" in defaults


def test_the_routing_map_sends_nothing_to_green_by_default():
    entries = [line.split() for line in (HAPROXY_DIR / ROUTING_MAP).read_text().splitlines()
               if line.strip() and not line.startswith("#")]  # fmt: skip
    assert entries == [[GREEN_PERCENT_KEY, "0"]]
    frontend = sections(CONFIG)["frontend vigil"]
    assert f"str({GREEN_PERCENT_KEY}),map({MAP_IN_CONTAINER},0)" in " ".join(frontend)
    assert "default_backend blue" in frontend


def test_every_server_is_a_compose_replica_that_answers_the_agent_check():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    haproxy = compose["services"]["haproxy"]
    assert f"./deploy/haproxy/{ROUTING_MAP}:{MAP_IN_CONTAINER}:ro" in haproxy["volumes"]
    for backend in BACKENDS:
        for line in sections(CONFIG)[f"backend {backend}"]:
            if not line.startswith("server "):
                continue
            _, name, address = line.split()
            assert address == f"{name}:8000"
            command = compose["services"][name]["command"]
            assert command[command.index("--agent-port") + 1] == "8001", name


def test_the_test_rewrite_changes_addresses_only(tmp_path):
    listeners = Listeners(front=1001, monitoring=1002, api=1003)
    rewritten = haproxy_config(CONFIG, {"vigil-1": (2001, 3001), "vigil-green-1": (2002, 3002)}, listeners,
                               tmp_path / ROUTING_MAP)  # fmt: skip
    ours, theirs = sections(rewritten), sections(CONFIG)
    assert set(theirs) - set(ours) == {"resolvers docker"}
    assert set(ours) == set(theirs) - {"resolvers docker"}
    for name, lines in theirs.items():
        if name == "resolvers docker":
            continue
        expected = []
        for line in lines:
            line = line.replace(" resolvers docker", "").replace(MAP_IN_CONTAINER, str(tmp_path / ROUTING_MAP))
            line = {"bind :8000": "bind 127.0.0.1:1001", "bind :8405": "bind 127.0.0.1:1002"}.get(line, line)
            line = line.replace("ipv4@127.0.0.1:9999", "ipv4@127.0.0.1:1003")
            server = re.fullmatch(r"server (\S+) \S+", line)
            if server and server.group(1) not in ("vigil-1", "vigil-green-1"):
                continue
            if server:
                port, agent = (2001, 3001) if server.group(1) == "vigil-1" else (2002, 3002)
                line = f"server {server.group(1)} 127.0.0.1:{port} agent-port {agent}"
            expected.append(line)
        assert ours[name] == expected, name


@pytest.mark.parametrize("command", [["--help"], ["status", "--help"], ["restart", "--help"], ["shift", "--help"]])
def test_the_rollout_script_runs_from_the_repository(command):
    result = subprocess.run(["python3", "-m", "deploy.haproxy.rollout", *command], cwd=ROOT, capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_the_admin_runtime_api_listens_on_loopback_only():
    """Admin level and unauthenticated: on 0.0.0.0 any container on compose's network could drain the fleet."""
    sockets = [line.split() for line in sections(CONFIG)["global"] if line.startswith("stats socket")]
    assert sockets and all(words[2].startswith(("ipv4@127.0.0.1:", "/")) for words in sockets), sockets


# What busybox's nc does in compose's HAProxy container: standard input to the API, its answer to standard output.
NC = """import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as connection:
    connection.sendall(sys.stdin.buffer.read())
    while chunk := connection.recv(65536):
        sys.stdout.buffer.write(chunk)
"""


def test_rollout_reaches_the_runtime_api_through_a_command_as_through_docker_compose_exec(tmp_path):
    haproxy = HAProxy(tmp_path, [])
    try:
        carrier = shlex.join([sys.executable, "-c", NC, "127.0.0.1", str(haproxy.listeners.api)])
        api = RuntimeAPI(f"exec:{carrier}")
        assert api.map_path(ROUTING_MAP) == str(tmp_path / ROUTING_MAP)
        assert "Name: HAProxy" in api.ask("show info")
        status = subprocess.run([sys.executable, "-m", "deploy.haproxy.rollout", "--api", f"exec:{carrier}",
                                 "status"], cwd=ROOT, capture_output=True, text=True, timeout=30)  # fmt: skip
        broken = subprocess.run([sys.executable, "-m", "deploy.haproxy.rollout", "--api", "exec:false", "status"],
                                cwd=ROOT, capture_output=True, text=True, timeout=30)  # fmt: skip
    finally:
        haproxy.stop()
    assert status.returncode == 0, status.stderr
    assert broken.returncode == 1 and "false exited 1" in broken.stderr, broken.stderr
