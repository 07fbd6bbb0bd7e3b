"""The building blocks of Vigil's Grafana dashboards: queries filtered by the dashboard variables, panels,
their layout, and the dashboard around them. dashboards/build.py puts them together."""

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Metrics that carry no `model` label; everything else is filtered by model too.
WITHOUT_MODEL = (
    "vigil_gpu_", "vigil_host_", "vigil_hardware_", "vigil_http_requests_total", "vigil_request_errors_total",
    "process_",
)
# HAProxy's own exporter (the fleet dashboard).
BALANCER_PREFIX = "haproxy_"
# The OpenAI API's traffic, without Prometheus scrapes and health probes.
API_ROUTES = 'route!~"/metrics|/livez|/readyz|/health"'
TOKENS_PER_SECOND = "suffix: tok/s"


def series(metric: str, *matchers: str) -> str:
    """``metric{...}`` filtered by the dashboard's variables, plus any extra matchers. HAProxy's metrics are
    filtered by the balancer they come from."""
    if metric.startswith(BALANCER_PREFIX):
        scope = ['instance=~"$balancer"']
    elif metric.startswith(WITHOUT_MODEL):
        scope = ['instance=~"$instance"']
    else:
        scope = ['model=~"$model"', 'instance=~"$instance"']
    return f"{metric}{{{', '.join([*scope, *matchers])}}}"


def rate(metric: str, *matchers: str, window: str = "$__rate_interval") -> str:
    return f"rate({series(metric, *matchers)}[{window}])"


def quantile(q: float, histogram: str, by: str = "model", window: str = "$__rate_interval") -> str:
    grouping = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({grouping}) ({rate(histogram + '_bucket', window=window)}))"


def target(expr: str, legend: str = "", exemplar: bool = False, instant: bool = False, heatmap: bool = False) -> dict:
    found = {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
        "exemplar": exemplar,
    }
    if heatmap:
        found["format"] = "heatmap"
    return found


def quantile_targets(histogram: str, quantiles=(0.5, 0.95, 0.99), exemplar: bool = True) -> list[dict]:
    """One line per quantile and model; exemplars link the points to the traces of single requests."""
    return [target(quantile(q, histogram), f"p{round(q * 100)} {{{{model}}}}", exemplar=exemplar) for q in quantiles]


def thresholds(*steps) -> dict:
    """``thresholds("green", 1.5, "yellow", 2, "red")``: a base colour, then (value, colour) pairs."""
    found = [{"color": steps[0], "value": None}]
    found += [{"color": color, "value": value} for value, color in zip(steps[1::2], steps[2::2], strict=True)]
    return {"mode": "absolute", "steps": found}


def timeseries(
    title,
    description,
    targets,
    unit="short",
    width=12,
    min_value=None,
    max_value=None,
    limits=None,
    stacked=False,
    stepped=False,
    bars=False,
    legend_calcs=(),
):
    """A time series panel; ``limits`` (a thresholds dict) draws its steps as dashed lines."""
    defaults = {
        "unit": unit,
        "custom": {
            "drawStyle": "bars" if bars else "line",
            "lineInterpolation": "stepAfter" if stepped else "linear",
            "lineWidth": 1,
            "fillOpacity": 30 if stacked else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
            "thresholdsStyle": {"mode": "dashed" if limits else "off"},
        },
        "thresholds": limits or thresholds("green"),
        "color": {"mode": "palette-classic"},
    }
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "displayMode": "table" if legend_calcs else "list", "placement": "bottom", "showLegend": True,
                "calcs": list(legend_calcs),
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (width, 8),
    }


def stat(title, description, expr, unit, limits, width=4, mappings=None, sparkline=False, idle="no traffic"):
    """A single-value tile. With nothing to show (no series, or NaN such as 0/0 on an idle server) it reads
    ``idle`` in blue, never "NaN" nor its lowest threshold's colour, which is often red."""
    idle_mapping = {"type": "special", "options": {"match": "null+nan", "result": {"text": idle, "color": "blue"}}}
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [target(expr, instant=not sparkline)],
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "decimals": 2,
                "thresholds": limits,
                "mappings": [*(mappings or []), idle_mapping],
                "noValue": idle,
                "color": {"mode": "thresholds"},
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "area" if sparkline else "none",
            "justifyMode": "auto",
            "textMode": "value",
            "orientation": "auto",
        },
        "_size": (width, 5),
    }


def heatmap(title, description, histogram, unit, width=12):
    """How a histogram's observations spread over its buckets, interval by interval."""
    expr = f"sum by (le) (increase({series(histogram + '_bucket')}[$__rate_interval]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [target(expr, "{{le}}", heatmap=True)],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
            },
            "yAxis": {"axisPlacement": "left", "unit": unit, "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "filterValues": {"le": 1e-9},
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
            "showValue": "never",
        },
        "_size": (width, 8),
    }


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def layout(panels: list[dict]) -> list[dict]:
    """Numbers the panels and places them left to right, starting a new line when one is full or at a row."""
    x = y = line_height = 0
    placed = []
    for panel_id, panel in enumerate(panels, start=1):
        width, height = panel.pop("_size")
        if x + width > 24 or panel["type"] == "row":
            x, y, line_height = 0, y + line_height, 0
        placed.append({"id": panel_id, "gridPos": {"h": height, "w": width, "x": x, "y": y}, **panel})
        x += width
        line_height = max(line_height, height)
    return placed


def query_variable(name: str, label: str, query: str) -> dict:
    """A multi-value variable listing the values of a label (``label_values(...)``), "All" selected."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def variables(filtered: bool = True) -> dict:
    """The data source picker, and unless the dashboard covers the whole service, the model and instance ones."""
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "options": [],
                "refresh": 1,
                "regex": "",
                "includeAll": False,
                "multi": False,
                "hide": 0,
            },
            *(
                [
                    query_variable("model", "Model", "label_values(vigil_engine_ready, model)"),
                    query_variable(
                        "instance", "Instance", 'label_values(vigil_engine_ready{model=~"$model"}, instance)'
                    ),
                ]
                if filtered
                else []
            ),
        ]
    }


def dashboard(uid: str, title: str, description: str, panels: list[dict], filtered: bool = True) -> dict:
    return {
        "id": None,
        "uid": uid,
        "title": f"Vigil / {title}",
        "description": description,
        "tags": ["vigil"],
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [
            {
                "title": "Vigil",
                "type": "dashboards",
                "tags": ["vigil"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "templating": variables(filtered),
        "panels": layout(panels),
    }
