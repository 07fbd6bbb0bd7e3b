"""Grafana dashboards and provisioning, checked without a Grafana: structure, variables, queries."""

import importlib.util
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dashboard_queries import (
    DASHBOARD_DIR,
    DCGM_METRICS,
    HAPROXY_METRICS,
    ROOT,
    UNLABELLED_BY_MODEL,
    dashboard_queries,
    exported_name,
    is_known_metric,
    load_dashboards,
    metric_names,
    panels,
    stat_display,
    substitute,
)

DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
EXPECTED_UIDS = {
    "overview.json": "vigil-overview",
    "infrastructure.json": "vigil-infrastructure",
    "service.json": "vigil-service",
    "model.json": "vigil-model",
    "slo.json": "vigil-slo",
    "fleet.json": "vigil-fleet",
}
# The SLO dashboard covers the whole service: no model selector, windows from alerts/slo.yml; only its last row
# splits the SLOs by replica, with the instance selector.
SERVICE_WIDE = {"slo.json"}
# Panel titles (case-insensitive substrings) each dashboard must have.
REQUIRED_PANELS = {
    "overview.json": ["TTFT P99 (SLO", "Output speed P50 (target", "Success rate (SLO", "Traffic", "Errors",
                      "Latency", "Saturation"],
    "slo.json": ["Availability: error budget left", "Availability: burn rate",
                 "Availability: budget consumed per incident", "Time to first token: burn rate",
                 "Inter-token latency: burn rate"],
    "service.json": ["Requests per second by code", "Errors by reason", "End-to-end latency P50 / P95 / P99",
                     "Time to first token P50 / P95 / P99", "Inter-token latency P50 / P95 / P99", "Queue time",
                     "Requests running and waiting", "Batch size distribution", "KV cache usage", "Preemptions",
                     "Prefix cache hit rate"],
    "model.json": ["Tokens per second", "Output length distribution", "Temperature distribution",
                   "Top-p distribution", "Finish reasons", "Repetition ratio P95", "Anomalies by kind"],
    "infrastructure.json": ["GPU temperature", "GPU memory", "GPU utilisation", "GPU power", "Host CPU",
                            "Host memory", "Process RSS", "Hardware readings failed"],
    "fleet.json": ["Replicas ready", "Requests running, per replica", "Requests waiting, per replica",
                   "KV cache usage, per replica", "Weight each replica reports", "Requests in flight, per server",
                   "Servers UP", "Share of new requests to green", "Retried and redispatched"],
}  # fmt: skip
# Panels whose queries must ask for exemplars, to link latency to traces.
LATENCY_PANELS = {
    "overview.json": ["Latency"],
    "service.json": ["End-to-end latency", "Time to first token", "Inter-token latency", "Queue time", "Prefill"],
}
HEATMAPS = {"service.json": ["Batch size distribution"], "model.json": ["Output length distribution"]}
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")


def find_panel(dashboard: dict, title: str) -> dict:
    matches = [panel for panel in panels(dashboard) if title.lower() in panel["title"].lower()]
    assert matches, f"no panel titled like {title!r} on {dashboard['title']}"
    return matches[0]


def every_value(node, key: str):
    """Every value stored under ``key`` anywhere in a JSON tree."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == key:
                yield value
            yield from every_value(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from every_value(item, key)


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return load_dashboards()


def test_committed_json_is_the_generators_output():
    spec = importlib.util.spec_from_file_location("dashboards_build", DASHBOARD_DIR / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    rendered = build.render()
    assert set(rendered) == {path.name for path in DASHBOARD_DIR.glob("*.json")}
    for name, text in rendered.items():
        assert (DASHBOARD_DIR / name).read_text() == text, f"{name} is stale: run python dashboards/build.py"


def test_six_dashboards_with_stable_unique_uids(dashboards):
    assert {name: board["uid"] for name, board in dashboards.items()} == EXPECTED_UIDS
    for board in dashboards.values():
        assert board["id"] is None, "provisioned dashboards must not carry a database id"
        assert "vigil" in board["tags"]


def test_datasource_model_and_instance_variables(dashboards):
    for name, board in dashboards.items():
        variables = {variable["name"]: variable for variable in board["templating"]["list"]}
        assert "instance" in variables, f"{name} has no instance variable"
        if name in SERVICE_WIDE:
            assert set(variables) == {"datasource", "instance"}, name
            assert variables["instance"]["definition"] == "label_values(vigil_engine_ready, instance)"
            continue
        assert {"datasource", "model", "instance"} <= set(variables), name
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert variables["model"]["definition"] == "label_values(vigil_engine_ready, model)"
        assert variables["instance"]["definition"] == 'label_values(vigil_engine_ready{model=~"$model"}, instance)'
        if name == "fleet.json":
            assert variables["balancer"]["definition"] == "label_values(haproxy_process_build_info, instance)"
        for variable in (variables["model"], variables["instance"], variables.get("balancer", variables["model"])):
            assert variable["datasource"] == DATASOURCE_REF
            assert variable["query"]["query"] == variable["definition"]
            assert variable["includeAll"] and variable["multi"]
            # With no custom "All" value, Grafana expands All to the listed values; ".*" would also match
            # exporters' instances (node-exporter's own process_* metrics, for one).
            assert not variable.get("allValue")


def test_no_hard_coded_datasource(dashboards):
    for name, board in dashboards.items():
        references = list(every_value(board, "datasource"))
        assert references, name
        assert all(reference == DATASOURCE_REF for reference in references), name
        text = json.dumps(board)
        assert "vigil-prometheus" not in text and "datasourceUid" not in text, name
        for panel in panels(board):
            assert panel["datasource"] == DATASOURCE_REF, panel["title"]
            assert panel["targets"], panel["title"]
            assert all(target["datasource"] == DATASOURCE_REF for target in panel["targets"]), panel["title"]


def test_every_query_reads_exported_metrics_filtered_by_the_variables(dashboards):
    for name, board in dashboards.items():
        for panel in panels(board):
            for target in panel["targets"]:
                expr = target["expr"]
                names = metric_names(expr)
                assert names, f"{panel['title']}: no metric in {expr!r}"
                assert all(is_known_metric(name) for name in names), f"{panel['title']}: unknown metric in {expr!r}"
                selected = {metric: matchers for metric, matchers in SELECTOR.findall(expr)}
                assert names == set(selected), f"{panel['title']}: a metric without a label selector in {expr!r}"
                if name in SERVICE_WIDE:
                    assert all('slo="' in matchers or 'instance=~"$instance"' in matchers
                               for matchers in selected.values()), panel["title"]  # fmt: skip
                    continue
                for metric, matchers in selected.items():
                    if metric in HAPROXY_METRICS:
                        assert matchers.startswith('instance=~"$balancer"'), f"{panel['title']}: {metric}"
                        continue
                    if metric in DCGM_METRICS:  # per GPU, from dcgm-exporter: its instance is not a replica
                        assert matchers == 'job="dcgm"', f"{panel['title']}: {metric}"
                        continue
                    assert 'instance=~"$instance"' in matchers, f"{panel['title']}: {metric} not filtered by instance"
                    has_model = 'model=~"$model"' in matchers
                    carries_model = exported_name(metric) not in UNLABELLED_BY_MODEL and not metric.startswith(
                        "process_"
                    )
                    assert has_model == carries_model, f"{panel['title']}: {metric} model filter is wrong"


def test_variable_queries_read_exported_metrics(dashboards):
    for board in dashboards.values():
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                metric = re.fullmatch(r"label_values\((\w+)[{,].*", variable["definition"]).group(1)
                assert is_known_metric(metric)


def test_rate_windows_come_from_grafana_or_the_slo_window(dashboards):
    slo_window = yaml.safe_load((ROOT / "alerts/slo.yml").read_text())["window"]
    for name, board in dashboards.items():
        allowed = ("$__rate_interval", "$__range")
        if name in SERVICE_WIDE:
            allowed = ("$__interval", slo_window, "$__rate_interval")  # the by-replica row reads now
        for panel in panels(board):
            for target in panel["targets"]:
                windows = re.findall(r"\[([^\]]+)\]", target["expr"])
                assert all(window in allowed for window in windows), target["expr"]


def test_required_panels_exist(dashboards):
    for name, titles in REQUIRED_PANELS.items():
        for title in titles:
            find_panel(dashboards[name], title)


def test_latency_panels_link_to_traces_through_exemplars(dashboards):
    for name, titles in LATENCY_PANELS.items():
        for title in titles:
            panel = find_panel(dashboards[name], title)
            assert all(target["exemplar"] for target in panel["targets"]), panel["title"]


def test_distributions_are_heatmaps_over_buckets(dashboards):
    for name, titles in HEATMAPS.items():
        for title in titles:
            panel = find_panel(dashboards[name], title)
            assert panel["type"] == "heatmap" and panel["options"]["calculate"] is False
            assert all(t["format"] == "heatmap" and "_bucket{" in t["expr"] for t in panel["targets"])


def test_tiles_read_no_traffic_rather_than_nan_or_red_when_there_is_nothing_to_show(dashboards):
    for board in dashboards.values():
        for panel in panels(board):
            if panel["type"] != "stat":
                continue
            for value in (None, math.nan):
                text, colour = stat_display(panel, value)
                assert text != "NaN" and colour != "red", f"{panel['title']}: {value} shows {text!r} in {colour}"
    tile = {"fieldConfig": {"defaults": {"thresholds": {"steps": [{"color": "red", "value": None}]}}}}
    assert stat_display(tile, math.nan) == ("NaN", "red"), "the check itself must see a bare tile fail"


def test_panels_have_unique_ids_and_fit_the_grid(dashboards):
    for name, board in dashboards.items():
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), name
        cells = set()
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, panel["title"]
            columns, lines = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
            area = {(x, y) for x in columns for y in lines}
            assert not area & cells, f"{name}: {panel['title']} overlaps another panel"
            cells |= area


def test_every_query_parses_as_promql(tmp_path: Path):
    """promtool parses each query (Grafana's variables filled in) as a recording rule's expression."""
    promtool = shutil.which("promtool")
    assert promtool, "`promtool` is not on PATH: apt-get install prometheus"
    queries = dashboard_queries(model="smollm2", instance="vigil:8000")
    rules = [{"record": f"dashboard_query_{index}", "expr": expr} for index, (_, _, expr) in enumerate(queries)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_query_helper_fills_in_every_variable():
    queries = dashboard_queries(model="smollm2", instance="vigil:8000")
    assert len(queries) > 40
    assert all("$" not in expr for _, _, expr in queries)
    assert substitute('rate(x{model=~"$model", i=~"${instance}"}[$__rate_interval])', "m", "i:1") == (
        'rate(x{model=~"m", i=~"i:1"}[1m])'
    )
    with pytest.raises(KeyError):
        substitute("x[$__unknown]", "m", "i")


def test_provisioned_datasources_link_exemplars_to_traces():
    config = yaml.safe_load((DASHBOARD_DIR / "provisioning/datasources/vigil.yml").read_text())
    sources = {source["type"]: source for source in config["datasources"]}
    prometheus, jaeger = sources["prometheus"], sources["jaeger"]
    assert prometheus["uid"] == "vigil-prometheus" and prometheus["isDefault"]
    assert prometheus["url"] == "http://prometheus:9090"
    assert prometheus["jsonData"]["exemplarTraceIdDestinations"] == [
        {"name": "trace_id", "datasourceUid": jaeger["uid"]}
    ]
    assert jaeger["url"] == "http://jaeger:16686"


def test_dashboard_provider_loads_the_dashboards_folder_into_vigil():
    config = yaml.safe_load((DASHBOARD_DIR / "provisioning/dashboards/vigil.yml").read_text())
    [provider] = config["providers"]
    assert provider["type"] == "file" and provider["folder"] == "Vigil"
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["grafana"]["volumes"] if ":ro" in volume)
    assert mounts["./dashboards"] == provider["options"]["path"]
    assert mounts["./dashboards/provisioning/dashboards"] == "/etc/grafana/provisioning/dashboards"
    assert mounts["./dashboards/provisioning/datasources"] == "/etc/grafana/provisioning/datasources"
