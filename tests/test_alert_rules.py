"""Alert rules: checked and unit-tested with the real promtool, and held to the conventions every alert follows.

`make test` installs promtool (Debian's `prometheus`) when it is missing (tools/test-prerequisites.sh).
"""

import re
import shutil
import subprocess

import yaml
from dashboard_queries import ROOT, RULE_FILES, alert_rules, exported_name, is_known_metric, metric_names

RULE_TESTS = sorted((ROOT / "alerts/tests").glob("*.yml"))
IDLE_TEST = ROOT / "alerts/tests/idle_test.yml"
RUNBOOK = ROOT / "docs/runbook.md"
RUNBOOK_URL = re.compile(r"\{\{ \$externalLabels\.docs_url \}\}/runbook\.md#([\w-]+)")
DASHBOARD_URL = re.compile(
    r"\{\{ \$externalLabels\.grafana_url \}\}/d/vigil-[\w-]+(\?var-instance=.*)?|\{\{ \$externalURL \}\}/\S+"
)
HEARTBEAT = "VigilWatchdog"
# Alerts about the whole service, not one instance: they carry no `instance` label.
SERVICE_WIDE = {"VigilAbsent", HEARTBEAT} | {
    rule["alert"] for file, rule in alert_rules() if file == "slo"
}

REQUIRED_ALERTS = {
    "critical": {
        "VigilServerDown",
        "VigilAbsent",
        "VigilReplicaMissing",
        "VigilNotReady",
        "VigilStartupTooLong",
        "VigilHighErrorRate",
        "VigilKVCacheExhausted",
        "VigilEngineStalled",
        "VigilGPUOverheating",
        "VigilEngineErrors",
        "VigilQueueFullShedding",
        "VigilPrometheusRuleFailures",
        "VigilPrometheusErrorSendingAlerts",
        "VigilAlertmanagerFailedToSendNotifications",
    },
    "warning": {
        "VigilQueueGrowing",
        "VigilQueueTimeHigh",
        "VigilKVCacheHighUsage",
        "VigilPreemptionsSustained",
        "VigilGPUHot",
        "VigilRepetitionLoops",
        "VigilLengthFinishesHigh",
        "VigilRateLimitingSpike",
        "VigilScrapeTargetDown",
        "VigilHardwareSamplingStale",
    },
    "slo": {"VigilAvailabilityBudgetBurn", "VigilTimeToFirstTokenBudgetBurn", "VigilInterTokenLatencyBudgetBurn"},
    "watchdog": {HEARTBEAT},
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    assert path, "`promtool` is not on PATH: run `make test`, which installs Debian's prometheus package"
    return subprocess.run([path, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def unit_test_checks() -> list[tuple[str, dict, dict]]:
    """(test file name, test group, alert_rule_test entry) for every check in alerts/tests/."""
    return [
        (path.name, group, check)
        for path in RULE_TESTS
        for group in yaml.safe_load(path.read_text())["tests"]
        for check in group.get("alert_rule_test", [])
    ]


def test_promtool_checks_every_rule_file():
    result = promtool("check", "rules", *map(str, RULE_FILES.values()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(RULE_FILES) == set(REQUIRED_ALERTS)


def test_promtool_unit_tests_pass():
    assert RULE_TESTS, "no promtool tests in alerts/tests/"
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    firing, quiet = set(), set()
    for _, _, check in unit_test_checks():
        (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for _, rule in alert_rules()}
    assert names - firing == set(), "alerts with no test where they fire"
    assert names - quiet - {HEARTBEAT} == set(), "alerts with no test where they stay quiet"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


def test_every_burn_rate_alert_is_seen_both_paging_and_opening_a_ticket_or_quiet():
    severities: dict[str, set[str]] = {}
    for _, _, check in unit_test_checks():
        for alert in check.get("exp_alerts") or []:
            severities.setdefault(check["alertname"], set()).add(alert["exp_labels"]["severity"])
    assert severities["VigilAvailabilityBudgetBurn"] == {"critical", "warning"}
    assert severities["VigilTimeToFirstTokenBudgetBurn"] == {"critical", "warning"}


def test_the_idle_server_test_loads_every_rule_file():
    loaded = {(IDLE_TEST.parent / path).resolve() for path in yaml.safe_load(IDLE_TEST.read_text())["rule_files"]}
    assert loaded == {path.resolve() for path in RULE_FILES.values()}


def test_the_required_alerts_exist_in_their_file():
    for file, required in REQUIRED_ALERTS.items():
        present = {rule["alert"] for found_in, rule in alert_rules() if found_in == file}
        assert required - present == set(), f"missing from rules/{file}.yml"


def test_alert_names_and_severities_are_unique():
    keys = [(rule["alert"], rule["labels"]["severity"]) for _, rule in alert_rules()]
    assert len(keys) == len(set(keys))


def test_severity_follows_the_file():
    for file, rule in alert_rules():
        severity = rule.get("labels", {}).get("severity")
        expected = {"critical": {"critical"}, "warning": {"warning"}, "slo": {"critical", "warning"},
                    "watchdog": {"none"}}[file]  # fmt: skip
        assert severity in expected, f"{rule['alert']} in rules/{file}.yml has severity {severity!r}"
    for file, rule in alert_rules():
        if file in ("critical", "warning"):
            assert "record" not in rule


def test_every_alert_has_its_annotations_and_absolute_links_into_the_runbook():
    headings = re.findall(r"^#+\s+(.+)$", RUNBOOK.read_text(), flags=re.MULTILINE)
    anchors = {github_anchor(heading) for heading in headings}
    for _, rule in alert_rules():
        name = rule["alert"]
        annotations = rule.get("annotations", {})
        assert {"summary", "description", "value", "runbook_url", "dashboard_url"} <= set(annotations), name
        runbook = RUNBOOK_URL.fullmatch(annotations["runbook_url"])
        assert runbook, f"{name}: {annotations['runbook_url']!r} is not under $externalLabels.docs_url"
        assert runbook.group(1) == name.lower(), name
        assert runbook.group(1) in anchors, f"{name}: docs/runbook.md has no heading for #{runbook.group(1)}"
        assert DASHBOARD_URL.fullmatch(annotations["dashboard_url"]), f"{name}: {annotations['dashboard_url']!r}"


def test_rules_read_only_exported_metrics():
    for _, rule in alert_rules():
        names = metric_names(rule["expr"])
        assert names or rule["alert"] == HEARTBEAT, f"{rule['alert']}: found no metric in {rule['expr']!r}"
        unknown = {name for name in names if not is_known_metric(name)}
        assert unknown == set(), f"{rule['alert']} reads metrics nothing exports"


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
        ' unless up == 0 or slo:error_ratio:rate1h{slo="x"}'
    )
    assert metric_names(expr) == {"vigil_http_requests_total", "foo_bucket", "up", "slo:error_ratio:rate1h"}
    assert is_known_metric("vigil_time_to_first_token_seconds_bucket")
    assert is_known_metric("process_resident_memory_bytes")
    assert is_known_metric("slo:error_ratio:rate3d")
    assert not is_known_metric("foo_bucket")
    assert not is_known_metric("vigil_engine_ready_bucket")
    assert not is_known_metric("slo:error_ratio:rate7d")


def test_alert_rules_keep_the_instance_label_for_inhibition():
    # Every firing expectation in the promtool tests names the instance the alert is for, but service-wide ones.
    for file, _, check in unit_test_checks():
        for alert in check.get("exp_alerts") or []:
            if check["alertname"] in SERVICE_WIDE:
                assert "instance" not in alert["exp_labels"], check["alertname"]
            else:
                assert "instance" in alert["exp_labels"], f"{check['alertname']} in {file}"
