"""The SLOs have one source, alerts/slo.yml: the generated rules are up to date with it, its latency thresholds
are bucket boundaries the rules match exactly, and the alerts and dashboards use its targets."""

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from dashboard_queries import ROOT, alert_rules, load_dashboards, panels
from prometheus_client import CollectorRegistry, generate_latest

from alerts.slo import BURN_RATE_ALERTS, WINDOWS, burn_rate, load
from server.config_values import LATENCY_BUCKETS, SLO_LATENCY_THRESHOLDS_S
from telemetry.metrics import VigilMetrics

RULES = ROOT / "alerts/rules/slo.yml"
SLOS = {slo.name: slo for slo in load()}


def steps(panel: dict) -> list[dict]:
    return panel["fieldConfig"]["defaults"]["thresholds"]["steps"]


def generated() -> dict:
    return yaml.safe_load(RULES.read_text())


def test_the_generated_rules_are_the_generators_output():
    spec = importlib.util.spec_from_file_location("build_slo", ROOT / "alerts/build_slo.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert RULES.read_text() == build.render(), "alerts/rules/slo.yml is stale: run python alerts/build_slo.py"


def test_there_are_the_three_slos_the_issue_asks_for():
    assert set(SLOS) == {"availability", "time_to_first_token", "inter_token_latency"}
    assert SLOS["availability"].bad and not SLOS["availability"].histogram
    assert all(SLOS[name].histogram for name in ("time_to_first_token", "inter_token_latency"))


def test_latency_thresholds_are_bucket_boundaries_spelled_as_the_server_writes_them():
    registry = CollectorRegistry()
    metrics = VigilMetrics("m", registry)
    metrics.time_to_first_token.labels("m").observe(0.1)
    metrics.inter_token_latency.labels("m").observe(0.1)
    exposition = generate_latest(registry).decode()
    text = RULES.read_text()
    for slo in SLOS.values():
        if not slo.histogram:
            continue
        assert slo.threshold_seconds in LATENCY_BUCKETS
        name = slo.histogram.split("{")[0]
        assert f'{name}_bucket{{le="{slo.le}",model="m"}}' in exposition, f"the server writes no le={slo.le!r}"
        assert f'le="{slo.le}"' in text, slo.name


def test_the_server_knows_the_latency_slos_thresholds():
    """serve refuses --latency-buckets without them (the SLO pages would go blind): they must be alerts/slo.yml's."""
    assert sorted(slo.threshold_seconds for slo in SLOS.values() if slo.histogram) == list(SLO_LATENCY_THRESHOLDS_S)


def test_the_sli_missing_alert_looks_for_the_slos_own_buckets():
    [rule] = [rule for _, rule in alert_rules() if rule["alert"] == "VigilSLISeriesMissing"]
    for slo in SLOS.values():
        if slo.histogram:
            name = slo.histogram.split("{")[0]
            assert f'{name}_bucket{{le="{slo.le}"}}' in rule["expr"], slo.name


def test_a_threshold_between_buckets_is_refused(tmp_path: Path):
    spec = yaml.safe_load((ROOT / "alerts/slo.yml").read_text())
    spec["slos"][1]["latency"]["threshold_seconds"] = 1.8
    path = tmp_path / "slo.yml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match="not a bucket boundary"):
        load(path)


def test_every_slo_records_every_window_and_alerts_at_the_workbooks_burn_rates():
    groups = {group["name"]: group["rules"] for group in generated()["groups"]}
    for slo in SLOS.values():
        rules = groups[f"vigil-slo-{slo.name}"]
        records = {rule["record"] for rule in rules if "record" in rule}
        assert records == {f"slo:error_ratio:rate{w}" for w in WINDOWS} | {"slo:bad_events:rate5m", "slo:events:rate5m"}
        alerts = {rule["labels"]["severity"]: rule for rule in rules if "alert" in rule}
        assert set(alerts) == {"critical", "warning"}
        for spec in BURN_RATE_ALERTS:
            expr = alerts[spec.severity]["expr"]
            found = re.findall(r'slo:error_ratio:rate(\w+)\{slo="(\w+)"\} / ([\d.]+) > ([\d.]+)', expr)
            assert {s for _, s, _, _ in found} == {slo.name}
            assert {float(budget) for _, _, budget, _ in found} == {slo.budget}
            expected = {(window, burn_rate(pair, slo.window)) for pair in spec.windows for window in pair[1:]}
            assert {(window, float(rate)) for window, _, _, rate in found} == expected
    rates = sorted(burn_rate(pair, "30d") for spec in BURN_RATE_ALERTS for pair in spec.windows)
    assert rates == [1, 3, 6, 14.4]


def test_the_dashboards_show_the_same_targets():
    boards = load_dashboards()
    overview = {panel["title"]: panel for panel in panels(boards["overview.json"])}
    ttft, availability = SLOS["time_to_first_token"], SLOS["availability"]
    tile = overview[f"TTFT P99 (SLO ≤ {ttft.threshold_seconds:g} s)"]
    assert "histogram_quantile(0.99," in tile["targets"][0]["expr"]
    assert steps(tile)[-1] == {"color": "red", "value": ttft.threshold_seconds}
    tile = overview[f"Success rate (SLO ≥ {availability.objective:.0%})"]
    assert steps(tile)[-1] == {"color": "green", "value": availability.objective}
    assert 'reason="stream_error"' in tile["targets"][0]["expr"], "the tile counts failures as the SLO does"
    service = {panel["title"]: panel for panel in panels(boards["service.json"])}
    for slo, title in ((ttft, "Time to first token"), (SLOS["inter_token_latency"], "Inter-token latency")):
        assert steps(service[f"{title} P50 / P95 / P99"])[-1] == {"color": "red", "value": slo.threshold_seconds}
    slo_board = {panel["title"]: panel for panel in panels(boards["slo.json"])}
    for slo in SLOS.values():
        budget = slo_board[f"{slo.title}: error budget left ({slo.window})"]["targets"][0]["expr"]
        assert budget.endswith(f"/ {slo.budget:g}") and f"[{slo.window}]" in budget
        assert [step["value"] for step in steps(slo_board[f"{slo.title}: burn rate"])[1:]] == [1, 3, 6, 14.4]
