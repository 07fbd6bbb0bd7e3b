"""Alert rules and Alertmanager config: checked and unit-tested with the real promtool and amtool.

CI installs both (Debian: `prometheus`, `prometheus-alertmanager`); a missing binary fails the test.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dashboard_queries import ROOT, RULE_FILES, alert_rules, exported_name, is_known_metric, metric_names

RULE_TESTS = sorted((ROOT / "alerts/tests").glob("*.yml"))
RUNBOOK = ROOT / "docs/runbook.md"
ALERTMANAGER_CONFIG = ROOT / "alerts/alertmanager.yml"
RENDER_SCRIPT = ROOT / "alerts/render-alertmanager.sh"

SAMPLE_CHANNELS = {
    "ALERT_WEBHOOK_URL": "https://hooks.example.com/vigil?token=a&b=1",
    "ALERT_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/XXXXXXXX",
    "ALERT_SLACK_CHANNEL": "#vigil-alerts",
    "ALERT_EMAIL_TO": "oncall@example.com",
    "ALERT_EMAIL_FROM": "vigil-alerts@example.com",
    "ALERT_SMTP_SMARTHOST": "smtp.example.com:587",
    "ALERT_SMTP_USERNAME": "vigil-alerts@example.com",
    "ALERT_SMTP_PASSWORD": 'a "quoted" pass\\word',
}

REQUIRED_ALERTS = {
    "critical": {
        "VigilServerDown",
        "VigilNotReady",
        "VigilHighErrorRate",
        "VigilKVCacheExhausted",
        "VigilEngineStalled",
        "VigilGPUOverheating",
        "VigilEngineErrors",
    },
    "warning": {
        "VigilGPUHighUtilization",
        "VigilTimeToFirstTokenOverSLO",
        "VigilInterTokenLatencyOverSLO",
        "VigilQueueGrowing",
        "VigilQueueTimeHigh",
        "VigilKVCacheHighUsage",
        "VigilPreemptionsSustained",
        "VigilGPUHot",
        "VigilRepetitionLoops",
        "VigilLengthFinishesHigh",
        "VigilRateLimitingSpike",
    },
}


def binary(name: str) -> str:
    path = shutil.which(name)
    assert path, f"`{name}` is not on PATH: apt-get install prometheus prometheus-alertmanager"
    return path


def run(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, input=stdin, timeout=60)


def render_alertmanager(**variables: str) -> subprocess.CompletedProcess:
    """Runs the render script in an environment holding only PATH and ``variables``, like a fresh container."""
    return run("sh", str(RENDER_SCRIPT), env={"PATH": os.environ["PATH"], **variables})


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_promtool_checks_both_rule_files():
    result = run(binary("promtool"), "check", "rules", *map(str, RULE_FILES.values()))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    assert RULE_TESTS, "no promtool tests in alerts/tests/"
    result = run(binary("promtool"), "test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    firing, quiet = set(), set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case["alert_rule_test"]:
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for _, rule in alert_rules()}
    assert names - firing == set(), "alerts with no test where they fire"
    assert names - quiet == set(), "alerts with no test where they stay quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_the_required_alerts_exist_in_their_severity_file():
    for severity, required in REQUIRED_ALERTS.items():
        present = {rule["alert"] for file, rule in alert_rules() if file == severity}
        assert required - present == set(), f"missing from rules/{severity}.yml"


def test_alert_names_are_unique():
    names = [rule["alert"] for _, rule in alert_rules()]
    assert len(names) == len(set(names))


def test_every_rule_has_severity_summary_description_and_a_runbook_section():
    headings = re.findall(r"^#+\s+(.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    anchors = {github_anchor(heading) for heading in headings}
    for severity, rule in alert_rules():
        name = rule.get("alert")
        assert name, f"a recording rule in rules/{severity}.yml; only alerts belong there"
        assert rule.get("labels", {}).get("severity") == severity, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert re.fullmatch(r"(.*/)?docs/runbook\.md#[\w-]+", url), f"{name}: {url!r} is not into docs/runbook.md"
        assert url.split("#")[1] in anchors, f"{name}: docs/runbook.md has no heading for #{url.split('#')[1]}"


def test_rules_read_only_exported_metrics():
    for _, rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names, f"{rule['alert']}: found no metric in {rule['expr']!r}"
        unknown = {name for name in names if not is_known_metric(name)}
        assert unknown == set(), f"{rule['alert']} reads metrics Vigil does not export"


def test_no_rule_alerts_on_gpu_memory():
    for _, rule in alert_rules():
        assert not {exported_name(name) for name in metric_names(rule["expr"])} & {
            "vigil_gpu_memory_used_bytes",
            "vigil_gpu_memory_total_bytes",
        }, f"{rule['alert']}: GPU memory is pre-allocated by the KV cache pool; do not alert on it"


def test_metric_name_lexer():
    expr = (
        'sum by (instance) (rate(vigil_http_requests_total{code=~"5..", route!~"/metrics"}[5m]))'
        " / on (instance) group_left histogram_quantile(0.99, sum by (le) (rate(foo_bucket[1m]))) > 0.05"
        " unless up == 0"
    )
    assert metric_names(expr) == {"vigil_http_requests_total", "foo_bucket", "up"}
    assert is_known_metric("vigil_time_to_first_token_seconds_bucket")
    assert is_known_metric("process_resident_memory_bytes")
    assert not is_known_metric("foo_bucket")
    assert not is_known_metric("vigil_engine_ready_bucket")


def test_committed_alertmanager_config_is_valid():
    result = run(binary("amtool"), "check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_committed_alertmanager_config_is_the_default_rendering():
    result = render_alertmanager()
    assert result.returncode == 0, result.stderr
    stale = "out of date: run sh alerts/render-alertmanager.sh > alerts/alertmanager.yml"
    assert result.stdout == ALERTMANAGER_CONFIG.read_text(), stale


def test_alertmanager_routes_by_severity_and_inhibits_warnings_per_instance():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    routes = {tuple(route["matchers"]): route for route in config["route"]["routes"]}
    critical, warning = routes[('severity="critical"',)], routes[('severity="warning"',)]
    assert critical["repeat_interval"] == "1h" and critical["group_wait"] == "10s"
    assert warning["repeat_interval"] == "4h"
    assert config["inhibit_rules"] == [
        {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'], "equal": ["instance"]}
    ]
    for severity in ("critical", "warning"):
        result = run(
            binary("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
            f"--verify.receivers={severity}", f"severity={severity}", "alertname=VigilTest",
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_keep_the_instance_label_for_inhibition():
    # Every firing expectation in the promtool tests names the instance the alert is for.
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case["alert_rule_test"]:
                for alert in check.get("exp_alerts") or []:
                    assert "instance" in alert["exp_labels"], f"{check['alertname']} in {path.name}"


def test_rendering_with_every_channel_passes_amtool(tmp_path: Path):
    result = render_alertmanager(**SAMPLE_CHANNELS)
    assert result.returncode == 0, result.stderr
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(result.stdout)
    check = run(binary("amtool"), "check-config", str(rendered))
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(result.stdout)
    for receiver in config["receivers"]:
        urls = [hook["url"] for hook in receiver["webhook_configs"]]
        assert urls == ["http://alert-inbox:8080/alerts", SAMPLE_CHANNELS["ALERT_WEBHOOK_URL"]]
        assert receiver["slack_configs"][0]["api_url"] == SAMPLE_CHANNELS["ALERT_SLACK_WEBHOOK_URL"]
        assert receiver["slack_configs"][0]["channel"] == SAMPLE_CHANNELS["ALERT_SLACK_CHANNEL"]
        email = receiver["email_configs"][0]
        assert email["to"] == SAMPLE_CHANNELS["ALERT_EMAIL_TO"]
        assert email["smarthost"] == SAMPLE_CHANNELS["ALERT_SMTP_SMARTHOST"]
        assert email["auth_password"] == SAMPLE_CHANNELS["ALERT_SMTP_PASSWORD"]


def test_rendering_without_the_inbox_and_channels_is_still_valid(tmp_path: Path):
    result = render_alertmanager(ALERT_INBOX_URL="")
    assert result.returncode == 0, result.stderr
    rendered = tmp_path / "alertmanager.yml"
    rendered.write_text(result.stdout)
    check = run(binary("amtool"), "check-config", str(rendered))
    assert check.returncode == 0, check.stdout + check.stderr
    assert all(set(receiver) == {"name"} for receiver in yaml.safe_load(result.stdout)["receivers"])


@pytest.mark.parametrize(
    "variables",
    [{"ALERT_EMAIL_TO": "oncall@example.com"}, {"ALERT_SMTP_REQUIRE_TLS": "yes"}],
    ids=["email-without-smtp", "bad-tls-flag"],
)
def test_rendering_refuses_an_incomplete_channel(variables):
    result = render_alertmanager(**variables)
    assert result.returncode != 0
    assert "render-alertmanager:" in result.stderr
