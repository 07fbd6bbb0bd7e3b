"""Each console indicator's state (ok, warning, critical) over the ring, with the lines the alert rules and SLOs
draw (telemetry/console_thresholds.json, generated from alerts/): the console turns amber or red where the
alert's condition holds. An alert fires once its condition has held for its ``for:``; the console shows the
condition at once. The SLO tickets look back a day or more, past the ring's hour: the console applies their
burn rate to the hour it holds."""

import json
import operator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

THRESHOLDS_PATH = Path(__file__).resolve().with_name("console_thresholds.json")
COMPARE = {">": operator.gt, ">=": operator.ge}
SEVERITIES = ("critical", "warning")


def load_thresholds(path: Path = THRESHOLDS_PATH) -> dict:
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Indicator:
    """One figure and the state its alert lines give it; ``value`` is None while there is nothing to judge."""

    name: str
    value: float | None
    state: str  # "ok", "warning" or "critical"
    alert: str | None  # the alert whose line was crossed


class RingWindow:
    """The ring's last hour, read once, with sums and extremes over its most recent seconds."""

    def __init__(self, fields: tuple[str, ...], seconds: np.ndarray, values: np.ndarray, now: int) -> None:
        self.fields, self.seconds, self.values, self.now = fields, seconds, values, now

    def column(self, name: str, span_s: int) -> np.ndarray:
        column = self.values[self.seconds > self.now - span_s, self.fields.index(name)]
        return column[~np.isnan(column)]

    def total(self, name: str, span_s: int) -> float:
        return float(self.column(name, span_s).sum())

    def share(self, part: str, whole: str | tuple[str, ...], span_s: int) -> float | None:
        wholes = (whole,) if isinstance(whole, str) else whole
        total = sum(self.total(name, span_s) for name in wholes)
        return self.total(part, span_s) / total if total else None

    def highest(self, name: str, span_s: int) -> float | None:
        column = self.column(name, span_s)
        return float(column.max()) if column.size else None

    def latest(self, name: str, span_s: int = 60) -> float | None:
        column = self.column(name, span_s)
        return float(column[-1]) if column.size else None


def _judge(name: str, value: float | None, lines: dict, extra: dict[str, bool] | None = None) -> Indicator:
    """``extra`` holds a severity's further condition (the KV pool's critical line also needs preemptions)."""
    if value is not None:
        for severity in SEVERITIES:
            line = lines.get(severity)
            if line and COMPARE[line["operator"]](value, line["value"]) and (extra or {}).get(severity, True):
                return Indicator(name, value, severity, line["alert"])
    return Indicator(name, value, "ok", None)


def _queue(slow_share: float | None, line: dict) -> Indicator:
    """The rule's P95 is above its line exactly when more than 5% of queue times are: the console shows that
    share (``queue_slow`` counts the times above the line)."""
    if slow_share is not None and slow_share > 0.05:
        return Indicator("queue_time_over_p95_line_share", slow_share, "warning", line["alert"])
    return Indicator("queue_time_over_p95_line_share", slow_share, "ok", None)


def _slo(name: str, window: RingWindow, slo: dict) -> Indicator:
    """The share of slow observations, against the budget burnt at the page's rate over both its windows (both
    within the ring's hour) and at the ticket's rate over the hour."""
    long_s, short_s = slo["critical_windows_s"]
    long_share = window.share(f"{name}_slow", f"{name}_count", long_s)
    short_share = window.share(f"{name}_slow", f"{name}_count", short_s)
    if long_share is None:
        return Indicator(f"{name}_slo", None, "ok", None)
    page = slo["critical_burn_rate"] * slo["budget"]
    if short_share is not None and long_share > page and short_share > page:
        return Indicator(f"{name}_slo", long_share, "critical", slo["alert"])
    if long_share > slo["warning_burn_rate"] * slo["budget"]:
        return Indicator(f"{name}_slo", long_share, "warning", slo["alert"])
    return Indicator(f"{name}_slo", long_share, "ok", None)


def evaluate(window: RingWindow, thresholds: dict, gpu_count: int) -> list[Indicator]:
    rules = thresholds["rules"]
    preempted = window.total("preemptions", 300) > 0
    indicators = [
        _judge("kv_usage", window.highest("kv_usage", 60), rules["kv_usage"], {"critical": preempted}),
        _judge("waiting", window.latest("waiting"), rules["waiting"]),
        _queue(window.share("queue_slow", "queue_count", 300), rules["queue_time_p95_s"]["warning"]),
        _judge("preemptions_per_minute", window.total("preemptions", 300) / 5, rules["preemptions_per_minute"]),
        _judge("repetition_loop_share", window.share("repetition_loops", "finished", 900),
               rules["repetition_loop_share"]),
        _judge("length_finish_share", window.share("finished_length", "finished", 900),
               rules["length_finish_share"]),
        _judge("server_error_share",
               window.share("requests_5xx", ("requests_2xx", "requests_4xx", "requests_5xx"), 300),
               rules["server_error_share"]),
        *(_judge(f"gpu{index}_temperature", window.latest(f"gpu{index}_temperature"),
                 rules["gpu_temperature_celsius"]) for index in range(gpu_count)),
    ]
    return indicators + [_slo(name, window, slo) for name, slo in thresholds["slo"].items()]
