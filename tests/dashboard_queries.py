"""The PromQL that dashboards and alert rules run, for the static tests and the live end-to-end test.

``dashboard_queries(model, instance)`` gives every dashboard query with Grafana's variables filled in,
ready to send to a real Prometheus; ``alert_rules()`` gives every alert rule and ``recording_rules()`` every
recording rule; ``metric_names(expr)`` finds the metric names an expression reads, to compare with
``VIGIL_METRICS``, the monitoring's own metrics and the recorded series.
"""

import json
import math
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from telemetry.metrics import VigilMetrics

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"
RULE_DIR = ROOT / "alerts/rules"
# Rule file stem -> path: critical.yml and warning.yml hold alerts of that severity; slo.yml is generated from
# alerts/slo.yml; watchdog.yml holds the heartbeat.
RULE_FILES = {path.stem: path for path in sorted(RULE_DIR.glob("*.yml"))}



def _exported_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric Vigil exports, as defined once in telemetry/metrics.py: name -> (type, label names)."""
    metrics = VigilMetrics("m", CollectorRegistry())
    exported = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            exported[metric._name + suffix] = (metric._type, tuple(metric._labelnames))
    return exported


VIGIL_METRICS = {name: kind for name, (kind, _) in _exported_metrics().items()}
# Metrics without a `model` label: dashboards filter them by instance only.
UNLABELLED_BY_MODEL = {name for name, (_, labels) in _exported_metrics().items() if "model" not in labels}

# What Prometheus and Alertmanager export about themselves and the rules read (tests/test_ops_stack_e2e.py
# checks that the real binaries export them), and the series Prometheus itself writes.
MONITORING_METRICS = {
    "up",
    "prometheus_rule_evaluation_failures_total",
    "prometheus_notifications_errors_total",
    "prometheus_notifications_sent_total",
    "prometheus_notifications_dropped_total",
    "prometheus_config_last_reload_successful",
    "prometheus_rule_group_iterations_missed_total",
    "alertmanager_config_last_reload_successful",
    "alertmanager_notifications_total",
    "alertmanager_notifications_failed_total",
}
PROMETHEUS_SERIES = {"ALERTS"}
# dcgm-exporter's, with deploy/dcgm-counters.csv (the compose `gpu` profile): GPU health.
DCGM_METRICS = {
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
}
# What HAProxy's own exporter exports and the fleet dashboard reads (tests/test_fleet_e2e.py checks that the real
# binary exports them).
HAPROXY_METRICS = {
    "haproxy_process_build_info",
    "haproxy_server_weight",
    "haproxy_server_current_sessions",
    "haproxy_server_status",
    "haproxy_server_http_responses_total",
    "haproxy_backend_http_requests_total",
    "haproxy_backend_retry_warnings_total",
    "haproxy_backend_redispatch_warnings_total",
    "haproxy_backend_current_queue",
    "haproxy_frontend_http_requests_total",
    "haproxy_frontend_http_responses_total",
}

_HISTOGRAM_SERIES = {
    f"{name}{suffix}": name
    for name, kind in VIGIL_METRICS.items()
    if kind == "histogram"
    for suffix in ("_bucket", "_sum", "_count")
}

# PromQL's keywords and the functions used in this repository; any other word is taken for a metric name.
_AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "group"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}
_FUNCTIONS = {"rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "histogram_quantile"}
_FUNCTIONS |= {"avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "absent"}
_FUNCTIONS |= {"abs", "clamp_min", "clamp_max", "vector", "scalar", "time", "timestamp", "label_replace", "round"}
_PROMQL_WORDS = _AGGREGATIONS | _KEYWORDS | _FUNCTIONS | {"inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names that a PromQL expression reads (a simple lexer, enough for our expressions)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", text)  # numbers
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {word for word in words if word.lower() not in _PROMQL_WORDS}


def is_known_metric(name: str) -> bool:
    """Exported by Vigil (a histogram's _bucket/_sum/_count too) or its process_* collector, by the monitoring
    itself, HAProxy or dcgm-exporter, written by Prometheus (ALERTS), or recorded by a rule in alerts/rules/."""
    return (
        name in VIGIL_METRICS
        or name in _HISTOGRAM_SERIES
        or name.startswith("process_")
        or name in MONITORING_METRICS | PROMETHEUS_SERIES | HAPROXY_METRICS | DCGM_METRICS
        or name in {rule["record"] for _, rule in recording_rules()}
    )


def exported_name(name: str) -> str:
    """The metric family a series name belongs to (a histogram's _bucket gives the histogram)."""
    return _HISTOGRAM_SERIES.get(name, name)


def load_dashboards() -> dict[str, dict]:
    """The committed dashboards, by file name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))}


def panels(dashboard: dict) -> list[dict]:
    """Every panel of a dashboard, including those nested in collapsed rows, rows excluded."""
    found = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def substitute(
    expr: str, model: str, instance: str, datasource: str = "vigil-prometheus", balancer: str = "haproxy:8405"
) -> str:
    """``expr`` with Grafana's variables replaced the way Grafana would for one model and one instance (and, on the
    fleet dashboard, one balancer).

    The model, instance and balancer values go in verbatim: they sit inside ``=~"..."`` matchers, so pass a regex
    (``.*`` for all) or a plain name (a dot in a name matches itself too).
    """
    values = {
        "model": model,
        "instance": instance,
        "balancer": balancer,
        "datasource": datasource,
        "__rate_interval": "1m",
        "__interval": "15s",
        "__range": "1h",
    }

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def dashboard_queries(model: str, instance: str, balancer: str = "haproxy:8405") -> list[tuple[str, str, str]]:
    """(dashboard title, panel title, PromQL with variables substituted) for every query on every dashboard."""
    queries = []
    for dashboard in load_dashboards().values():
        for panel in panels(dashboard):
            for target in panel.get("targets", []):
                expr = substitute(target["expr"], model, instance, balancer=balancer)
                queries.append((dashboard["title"], panel["title"], expr))
    return queries


def is_balancer_query(expr: str) -> bool:
    """Reads HAProxy's metrics, which only a fleet behind HAProxy has."""
    return any(name in HAPROXY_METRICS for name in metric_names(expr))


def is_routing_query(expr: str) -> bool:
    """Reads the routing policy's decisions, which only a server with a routing alias (two models) makes."""
    return "vigil_router_decisions_total" in metric_names(expr)


def rules() -> list[tuple[str, dict]]:
    """(rule file stem, rule) for every rule in alerts/rules/."""
    found = []
    for stem, path in RULE_FILES.items():
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.extend((stem, rule) for rule in group["rules"])
    return found


def alert_rules() -> list[tuple[str, dict]]:
    """(rule file stem, rule) for every alerting rule in alerts/rules/."""
    return [(stem, rule) for stem, rule in rules() if "alert" in rule]


def recording_rules() -> list[tuple[str, dict]]:
    return [(stem, rule) for stem, rule in rules() if "record" in rule]


def stat_display(panel: dict, value: float | None) -> tuple[str, str]:
    """(text, colour) that a stat panel shows for ``value`` (None: the query returned no series), as Grafana
    decides: a special value mapping for null or NaN first, then the panel's "no value" text, then the value
    itself in the colour of the highest threshold step it reaches."""
    missing = value is None or math.isnan(value)
    defaults = panel["fieldConfig"]["defaults"]
    for mapping in defaults.get("mappings", []):
        match = mapping.get("options", {}).get("match") if mapping["type"] == "special" else None
        if missing and match in ("null+nan", "null" if value is None else "nan"):
            result = mapping["options"]["result"]
            return result.get("text", ""), result.get("color", "text")
    if value is None:
        return defaults.get("noValue", "No data"), "text"
    steps = defaults["thresholds"]["steps"]
    if math.isnan(value):
        return "NaN", steps[0]["color"]
    reached = [step for step in steps if step["value"] is None or value >= step["value"]]
    return str(value), reached[-1]["color"]
