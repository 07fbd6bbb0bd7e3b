"""The console's amber and red lines are the alert rules' and the SLOs' (alerts/): generated from them, and the
console's states change exactly where the rules' conditions do."""

import importlib.util
import math

import numpy as np
import pytest
from dashboard_queries import ROOT, alert_rules

from alerts.slo import BURN_RATE_ALERTS, load
from telemetry.console_health import RingWindow, evaluate, load_thresholds
from telemetry.console_rows import HOST_FIELDS, MODEL_FIELDS, SERVICE_FIELDS, gpu_fields

FIELDS = SERVICE_FIELDS + MODEL_FIELDS + HOST_FIELDS + gpu_fields(1)
NOW = 1_000_000


def _generator():
    spec = importlib.util.spec_from_file_location("console_thresholds", ROOT / "tools/console_thresholds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_thresholds_are_what_the_generator_writes_from_the_alerts():
    generator = _generator()
    assert (ROOT / "telemetry/console_thresholds.json").read_text() == generator.render()


def test_each_line_is_its_rules_comparison_and_each_slo_its_threshold_and_burn_rates():
    thresholds, rules = load_thresholds(), {rule["alert"]: rule for _, rule in alert_rules()}
    for indicator, lines in thresholds["rules"].items():
        for severity, line in lines.items():
            rule = rules[line["alert"]]
            assert rule["labels"]["severity"] == severity, (indicator, line["alert"])
            assert f"{line['operator']} {line['value']:g}" in rule["expr"], (indicator, rule["expr"])
    slos = {slo.alert: slo for slo in load()}
    for slo in thresholds["slo"].values():
        source = slos[slo["alert"]]
        assert (slo["threshold_s"], slo["budget"]) == (source.threshold_seconds, source.budget)
    page, ticket = (alert.windows[0] for alert in BURN_RATE_ALERTS)
    assert thresholds["slo"]["ttft"]["critical_burn_rate"] == pytest.approx(page[0] * 30 * 24)
    assert thresholds["slo"]["ttft"]["warning_burn_rate"] == pytest.approx(ticket[0] * 30)


def window(rows: dict[str, list[float]]) -> RingWindow:
    """The last len(rows) seconds, one value a second per named field, NaN elsewhere."""
    length = max(len(values) for values in rows.values())
    values = np.full((length, len(FIELDS)), math.nan)
    for name, column in rows.items():
        values[-len(column):, FIELDS.index(name)] = column
    return RingWindow(FIELDS, np.arange(NOW - length + 1, NOW + 1), values, NOW)


def states(rows: dict[str, list[float]]) -> dict[str, str]:
    return {i.name: i.state for i in evaluate(window(rows), load_thresholds(), gpu_count=1)}


def test_the_console_turns_amber_and_red_at_the_rules_lines():
    rules = load_thresholds()["rules"]
    kv_warning, kv_critical = rules["kv_usage"]["warning"]["value"], rules["kv_usage"]["critical"]["value"]
    assert states({"kv_usage": [kv_warning]})["kv_usage"] == "ok"  # the rule is "> 0.9"
    assert states({"kv_usage": [kv_warning + 0.001]})["kv_usage"] == "warning"
    # The critical line needs preemptions within 5 minutes as well, as VigilKVCacheExhausted does.
    assert states({"kv_usage": [kv_critical]})["kv_usage"] == "warning"
    assert states({"kv_usage": [kv_critical], "preemptions": [1.0]})["kv_usage"] == "critical"
    hot, overheating = (rules["gpu_temperature_celsius"][s]["value"] for s in ("warning", "critical"))
    assert [states({"gpu0_temperature": [t]})["gpu0_temperature"] for t in (hot, hot + 1, overheating + 1)] == [
        "ok", "warning", "critical"]
    waiting = rules["waiting"]["warning"]["value"]
    assert [states({"waiting": [w]})["waiting"] for w in (waiting, waiting + 1)] == ["ok", "warning"]
    errors = rules["server_error_share"]["critical"]["value"]
    assert states({"requests_2xx": [100 - 100 * errors], "requests_5xx": [100 * errors]})["server_error_share"] == "ok"
    assert states({"requests_2xx": [90], "requests_5xx": [10]})["server_error_share"] == "critical"


def test_a_latency_slo_pages_where_its_fastest_burn_rate_alert_would():
    slo = load_thresholds()["slo"]["ttft"]
    page_share = slo["critical_burn_rate"] * slo["budget"]
    hour = 3600
    # Slow observations just under the page's share, over the whole hour: a ticket, not a page.
    under = {"ttft_count": [100.0] * hour, "ttft_slow": [100 * page_share - 0.5] * hour}
    assert states(under)["ttft_slo"] == "warning"
    over = {"ttft_count": [100.0] * hour, "ttft_slow": [100 * page_share + 0.5] * hour}
    assert states(over)["ttft_slo"] == "critical"
    # A burst in the last 5 minutes alone does not burn the hour's share: no page.
    burst = {"ttft_count": [100.0] * hour, "ttft_slow": [0.0] * (hour - 300) + [100.0] * 300}
    assert states(burst)["ttft_slo"] != "critical"
    assert states({"ttft_count": [100.0] * hour, "ttft_slow": [0.0] * hour})["ttft_slo"] == "ok"
