"""Alertmanager's configuration, rendered by alerts/render-alertmanager.sh, checked with the real amtool:
routing per severity and for the heartbeat, working hours, inhibitions, secrets read from files, templates.

`make test` installs amtool (Debian's `prometheus-alertmanager`) when it is missing.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dashboard_queries import ROOT

ALERTMANAGER_CONFIG = ROOT / "alerts/alertmanager.yml"
RENDER_SCRIPT = ROOT / "alerts/render-alertmanager.sh"
TEMPLATES = ROOT / "alerts/templates"
SECRETS = {
    "pagerduty_routing_key": "R0UT1NGKEY0000000000000000000000",
    "opsgenie_api_key": "00000000-1111-2222-3333-444444444444",
    "slack_webhook_url": "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
    "smtp_password": 'a "quoted" pass\\word',
    "heartbeat_url": "https://hc-ping.com/5b1a7c3e-0000-4000-8000-000000000000",
}
EMAIL = {
    "ALERT_EMAIL_TO": "oncall@example.com",
    "ALERT_EMAIL_FROM": "vigil-alerts@example.com",
    "ALERT_SMTP_SMARTHOST": "smtp.example.com:587",
    "ALERT_SMTP_USERNAME": "vigil-alerts@example.com",
}
ALERT = {
    "status": "firing",
    "labels": {"alertname": "VigilServerDown", "severity": "critical", "instance": "vigil:8000"},
    "annotations": {
        "summary": "Vigil at vigil:8000 is down",
        "description": "Prometheus has failed to scrape vigil:8000 for more than a minute.",
        "value": "up = 0",
        "runbook_url": "https://vigil.example/docs/runbook.md#vigilserverdown",
        "dashboard_url": "https://grafana.example/d/vigil-infrastructure?var-instance=vigil:8000",
    },
    "startsAt": "2026-01-01T00:00:00Z",
    "endsAt": "0001-01-01T00:00:00Z",
}


def amtool(*args: str) -> subprocess.CompletedProcess:
    path = shutil.which("amtool")
    assert path, "`amtool` is not on PATH: run `make test`, which installs Debian's prometheus-alertmanager package"
    return subprocess.run([path, *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def render(secrets_dir: Path, **variables: str) -> subprocess.CompletedProcess:
    """The render script in an environment holding only PATH and ``variables``, like a fresh container."""
    environment = {"PATH": os.environ["PATH"], "ALERT_SECRETS_DIR": str(secrets_dir), **variables}
    return subprocess.run(["sh", str(RENDER_SCRIPT)], capture_output=True, text=True, env=environment, timeout=60)


def checked(text: str, directory: Path) -> dict:
    """``text`` written beside a copy of the templates (their glob is relative), passed through amtool."""
    shutil.copytree(TEMPLATES, directory / "templates", dirs_exist_ok=True)
    path = directory / "alertmanager.yml"
    path.write_text(text)
    result = amtool("check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 templates" in result.stdout
    return yaml.safe_load(text)


@pytest.fixture
def secrets(tmp_path: Path) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir()
    for name, value in SECRETS.items():
        (directory / name).write_text(value + "\n")
    return directory


def receivers(config: dict) -> dict[str, dict]:
    return {receiver["name"]: receiver for receiver in config["receivers"]}


def test_committed_config_is_valid_and_the_rendering_with_nothing_set(tmp_path: Path):
    result = render(tmp_path / "no-secrets")
    assert result.returncode == 0, result.stderr
    stale = "out of date: run sh alerts/render-alertmanager.sh > alerts/alertmanager.yml"
    assert result.stdout == ALERTMANAGER_CONFIG.read_text(), stale
    result = amtool("check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_routes_send_each_severity_and_the_heartbeat_to_its_own_receiver():
    cases = [
        (["severity=critical", "alertname=VigilServerDown"], "critical"),
        (["severity=warning", "alertname=VigilGPUHot"], "warning"),
        (["severity=none", "alertname=VigilWatchdog"], "heartbeat"),
        (["severity=critical", "alertname=VigilAvailabilityBudgetBurn", "slo=availability"], "critical"),
    ]
    for labels, receiver in cases:
        config = f"--config.file={ALERTMANAGER_CONFIG}"
        result = amtool("config", "routes", "test", config, f"--verify.receivers={receiver}", *labels)
        assert result.returncode == 0, f"{labels}: {result.stdout}{result.stderr}"


def test_warnings_wait_for_working_hours_and_pages_and_heartbeats_do_not():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    routes = {route["receiver"]: route for route in config["route"]["routes"]}
    assert routes["warning"]["active_time_intervals"] == ["working-hours"]
    assert "active_time_intervals" not in routes["critical"] and "mute_time_intervals" not in routes["critical"]
    assert "active_time_intervals" not in routes["heartbeat"]
    [interval] = config["time_intervals"]
    assert interval["name"] == "working-hours"
    [hours] = interval["time_intervals"]
    assert hours == {
        "weekdays": ["monday:friday"], "times": [{"start_time": "09:00", "end_time": "18:00"}], "location": "UTC"
    }  # fmt: skip
    assert routes["critical"]["repeat_interval"] == "1h" and routes["critical"]["group_wait"] == "10s"
    assert routes["warning"]["repeat_interval"] == "4h"
    assert routes["heartbeat"]["repeat_interval"] == "1m"


def test_working_hours_come_from_the_environment(tmp_path: Path):
    hours = {"ALERT_WORKING_DAYS": "monday:thursday", "ALERT_WORKING_HOURS": "08:30-17:00"}
    result = render(tmp_path, **hours, ALERT_TIMEZONE="Europe/Berlin")
    assert result.returncode == 0, result.stderr
    [interval] = checked(result.stdout, tmp_path)["time_intervals"]
    assert interval["time_intervals"] == [{
        "weekdays": ["monday:thursday"], "times": [{"start_time": "08:30", "end_time": "17:00"}],
        "location": "Europe/Berlin",
    }]  # fmt: skip


def test_inhibitions_hold_back_warnings_under_a_page_and_replica_pages_while_none_is_left():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    assert config["inhibit_rules"] == [
        {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'],
         "equal": ["instance", "slo"]},
        {"source_matchers": ['alertname="VigilAbsent"'], "target_matchers": ['alertname="VigilReplicaMissing"'],
         "equal": ["job"]},
        {"source_matchers": ['alertname="VigilAvailabilityBudgetBurn"', 'severity="critical"'],
         "target_matchers": ['alertname="VigilHighErrorRate"']},
    ]  # fmt: skip


def test_every_channel_reads_its_secret_from_a_file_and_passes_amtool(tmp_path: Path, secrets: Path):
    result = render(secrets, ALERT_SLACK_CHANNEL="#vigil-alerts", ALERT_OPSGENIE_API_URL="https://api.eu.opsgenie.com/",
                    **EMAIL)  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = checked(result.stdout, tmp_path)
    by_name = receivers(config)
    critical, warning, heartbeat = by_name["critical"], by_name["warning"], by_name["heartbeat"]
    assert critical["pagerduty_configs"][0]["routing_key_file"] == str(secrets / "pagerduty_routing_key")
    assert critical["opsgenie_configs"][0]["api_key_file"] == str(secrets / "opsgenie_api_key")
    assert critical["opsgenie_configs"][0]["api_url"] == "https://api.eu.opsgenie.com/"
    assert warning["slack_configs"][0]["api_url_file"] == str(secrets / "slack_webhook_url")
    assert warning["slack_configs"][0]["channel"] == "#vigil-alerts"
    assert warning["email_configs"][0]["auth_password_file"] == str(secrets / "smtp_password")
    assert warning["email_configs"][0]["to"] == EMAIL["ALERT_EMAIL_TO"]
    # Pages go to the pager only, chat and email get warnings only; the inbox gets both.
    assert not {"slack_configs", "email_configs"} & set(critical)
    assert not {"pagerduty_configs", "opsgenie_configs"} & set(warning)
    assert [hook["url"] for hook in heartbeat["webhook_configs"]] == [
        "http://alert-inbox:8080/heartbeat", SECRETS["heartbeat_url"]
    ]
    # No secret is written into the config but the heartbeat URL (Alertmanager 0.25's webhook has no url_file).
    for name, value in SECRETS.items():
        assert (value in result.stdout) == (name == "heartbeat_url"), name


def test_a_pager_without_a_heartbeat_url_is_warned_about(tmp_path: Path, secrets: Path):
    assert "WARNING" not in render(secrets, **EMAIL).stderr
    (secrets / "heartbeat_url").write_text("")
    result = render(secrets, **EMAIL)
    assert result.returncode == 0, result.stderr
    [warning] = result.stderr.splitlines()
    assert "pager is configured without the heartbeat_url secret" in warning
    assert "heartbeat" in receivers(checked(result.stdout, tmp_path))


def test_an_empty_secret_file_leaves_its_channel_off(tmp_path: Path, secrets: Path):
    (secrets / "pagerduty_routing_key").write_text("")
    result = render(secrets, **EMAIL)
    assert result.returncode == 0, result.stderr
    critical = receivers(checked(result.stdout, tmp_path))["critical"]
    assert "pagerduty_configs" not in critical and "opsgenie_configs" in critical


def test_rendering_without_the_inbox_and_channels_is_still_valid(tmp_path: Path):
    result = render(tmp_path / "no-secrets", ALERT_INBOX_URL="")
    assert result.returncode == 0, result.stderr
    assert all(set(receiver) == {"name"} for receiver in checked(result.stdout, tmp_path)["receivers"])


@pytest.mark.parametrize(
    "variables",
    [{"ALERT_EMAIL_TO": "oncall@example.com"}, {"ALERT_SMTP_REQUIRE_TLS": "yes"}, {"ALERT_WORKING_HOURS": "9-17"}],
    ids=["email-without-smtp", "bad-tls-flag", "bad-working-hours"],
)
def test_rendering_refuses_an_incomplete_channel(tmp_path: Path, variables):
    result = render(tmp_path, **variables)
    assert result.returncode != 0
    assert "render-alertmanager:" in result.stderr


def test_an_smtp_password_without_email_settings_is_refused(secrets: Path):
    result = render(secrets)
    assert result.returncode != 0 and "smtp_password" in result.stderr


@pytest.mark.parametrize("template", ["vigil.title", "vigil.text"])
def test_templates_show_summary_value_runbook_and_dashboard(tmp_path: Path, template):
    data = {
        "receiver": "critical", "status": "firing", "alerts": [ALERT], "groupLabels": {"alertname": "VigilServerDown"},
        "commonLabels": ALERT["labels"], "commonAnnotations": ALERT["annotations"], "externalURL": "http://am",
    }  # fmt: skip
    (tmp_path / "data.json").write_text(json.dumps(data))
    result = amtool(
        "template", "render", f"--template.glob={TEMPLATES}/*.tmpl", f"--template.data={tmp_path / 'data.json'}",
        f'--template.text={{{{ template "{template}" . }}}}',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    if template == "vigil.title":
        assert result.stdout.strip() == "[FIRING:1] VigilServerDown (critical) on vigil:8000"
    else:
        annotations = ALERT["annotations"]
        assert f"FIRING: {annotations['summary']}" in result.stdout
        assert f"Value: {annotations['value']}" in result.stdout
        assert f"Runbook: {annotations['runbook_url']}" in result.stdout
        assert f"Dashboard: {annotations['dashboard_url']}" in result.stdout
