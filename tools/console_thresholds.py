"""Writes telemetry/console_thresholds.json, the live console's amber and red lines, from the alert rules
(alerts/rules/*.yml) and the SLOs (alerts/slo.yml), so that the console and the alerts share one source.

    python tools/console_thresholds.py

tests/test_console_thresholds.py keeps the committed file equal to this script's output.
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from alerts.slo import BURN_RATE_ALERTS, burn_rate, load, seconds  # noqa: E402

OUTPUT = ROOT / "telemetry/console_thresholds.json"
# Each console indicator, per severity: the alert whose first comparison is the line, and the metric its
# expression must read (a check that the rule still means what the console shows).
RULE_THRESHOLDS = {
    "kv_usage": {"warning": ("VigilKVCacheHighUsage", "vigil_kv_cache_usage_ratio"),
                 "critical": ("VigilKVCacheExhausted", "vigil_kv_cache_usage_ratio")},
    "waiting": {"warning": ("VigilQueueGrowing", "vigil_num_requests_waiting")},
    "queue_time_p95_s": {"warning": ("VigilQueueTimeHigh", "vigil_request_queue_time_seconds_bucket")},
    "preemptions_per_minute": {"warning": ("VigilPreemptionsSustained", "vigil_preemptions_total")},
    "repetition_loop_share": {"warning": ("VigilRepetitionLoops", "repetition_loop")},
    "length_finish_share": {"warning": ("VigilLengthFinishesHigh", 'finish_reason="length"')},
    "server_error_share": {"critical": ("VigilHighErrorRate", 'code=~"5.."')},
    "gpu_temperature_celsius": {"warning": ("VigilGPUHot", "vigil_gpu_temperature_celsius"),
                                "critical": ("VigilGPUOverheating", "vigil_gpu_temperature_celsius")},
}
SLO_INDICATORS = {"time_to_first_token": "ttft", "inter_token_latency": "itl"}
COMPARISON = re.compile(r"(?<![=!<])(>=?)\s*(\d+(?:\.\d+)?)")


def alert_rules() -> dict[str, dict]:
    rules = {}
    for path in sorted((ROOT / "alerts/rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.update({rule["alert"]: rule for rule in group["rules"] if "alert" in rule})
    return rules


def rule_line(rule: dict, metric: str) -> dict:
    expr = rule["expr"]
    if metric not in expr:
        raise ValueError(f"{rule['alert']} no longer reads {metric}: update tools/console_thresholds.py")
    comparison = COMPARISON.search(expr)
    if comparison is None:
        raise ValueError(f"{rule['alert']} has no threshold comparison")
    return {"alert": rule["alert"], "operator": comparison.group(1), "value": float(comparison.group(2)),
            "for": rule.get("for", "0m")}


def slo_lines() -> dict:
    page, ticket = (alert.windows[0] for alert in BURN_RATE_ALERTS)
    lines = {}
    for slo in load():
        if slo.name not in SLO_INDICATORS:
            continue
        lines[SLO_INDICATORS[slo.name]] = {
            "alert": slo.alert, "threshold_s": slo.threshold_seconds, "budget": slo.budget,
            "critical_burn_rate": burn_rate(page, slo.window),
            "critical_windows_s": [seconds(page[1]), seconds(page[2])],
            "warning_burn_rate": burn_rate(ticket, slo.window),
        }
    return lines


def build() -> dict:
    rules = alert_rules()
    return {
        "generated_by": "tools/console_thresholds.py from alerts/rules/*.yml and alerts/slo.yml; do not edit",
        "rules": {
            indicator: {severity: rule_line(rules[alert], metric) for severity, (alert, metric) in lines.items()}
            for indicator, lines in RULE_THRESHOLDS.items()
        },
        "slo": slo_lines(),
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
