"""The SLOs of alerts/slo.yml as values, with the PromQL of their recording rules and burn-rate alerts.

alerts/build_slo.py (the rules), dashboards/build.py (the dashboards) and the tests all read the SLOs through
this module, so that every threshold has one source.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.utils import floatToGoString

from server.config_values import LATENCY_BUCKETS

SPEC = Path(__file__).resolve().with_name("slo.yml")
# The windows that error ratios are recorded over; the burn-rate alerts pair them.
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
_SECONDS = {"m": 60, "h": 3600, "d": 86400}


def seconds(window: str) -> int:
    """ "30m" -> 1800."""
    match = re.fullmatch(r"(\d+)([mhd])", window)
    if not match:
        raise ValueError(f"not a window like 5m, 6h or 30d: {window!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


@dataclass(frozen=True)
class BurnRateAlert:
    """Fires while the error budget burns faster than ``budget_share`` of it per ``long`` window, over both the
    ``long`` and the ``short`` window (the short one lets the alert stop soon after the burning does)."""

    severity: str
    windows: tuple[tuple[float, str, str], ...]  # (budget share, long window, short window)
    wait: str  # the rule's `for:`


# The Google SRE workbook's multiwindow, multi-burn-rate alerts: page when 2% of the budget goes in an hour or 5%
# in six hours; open a ticket when 10% goes in a day or in three days. Over 30 days these are burn rates of
# 14.4 (1h and 5m), 6 (6h and 30m), 3 (1d and 2h) and 1 (3d and 6h).
BURN_RATE_ALERTS = (
    BurnRateAlert("critical", ((0.02, "1h", "5m"), (0.05, "6h", "30m")), "2m"),
    BurnRateAlert("warning", ((0.10, "1d", "2h"), (0.10, "3d", "6h")), "15m"),
)


def rate_sum(selector: str, window: str) -> str:
    return f"sum(rate({selector}[{window}]))"


def series(selector: str, suffix: str, *matchers: str) -> str:
    """``metric{a="b"}``, ``_bucket``, ``le="2.0"`` -> ``metric_bucket{a="b", le="2.0"}``, skipping empty matchers."""
    name, _, rest = selector.partition("{")
    kept = [m for m in (rest.rstrip("}"), *matchers) if m]
    return f"{name}{suffix}{{{', '.join(kept)}}}"


@dataclass(frozen=True)
class SLO:
    name: str
    title: str
    objective: float
    description: str
    window: str
    bad: tuple[str, ...] = ()  # counters of bad events
    total: str = ""  # the counter of all events
    histogram: str = ""  # for a latency SLO: its histogram's selector, and the bucket boundary good events are under
    threshold_seconds: float = 0.0

    @property
    def budget(self) -> float:
        """The share of events allowed to be bad."""
        return round(1 - self.objective, 10)

    @property
    def alert(self) -> str:
        return "Vigil" + "".join(word.capitalize() for word in self.name.split("_")) + "BudgetBurn"

    @property
    def le(self) -> str:
        """The threshold as the `le` label value that the Python client writes on the bucket."""
        return floatToGoString(self.threshold_seconds)

    def bad_rate(self, window: str, matcher: str = "") -> str:
        """Bad events per second over ``window`` (``matcher`` added to every selector); 0, not nothing, while a
        bad-event counter does not exist yet."""
        if self.histogram:
            good = rate_sum(series(self.histogram, "_bucket", matcher, f'le="{self.le}"'), window)
            return f"{self.total_rate(window, matcher)}\n  - {good}"
        bad = (rate_sum(series(selector, "", matcher), window) for selector in self.bad)
        return "\n  + ".join(f"({rate} or vector(0))" for rate in bad)

    def total_rate(self, window: str, matcher: str = "") -> str:
        if self.histogram:
            return rate_sum(series(self.histogram, "_count", matcher), window)
        return rate_sum(series(self.total, "", matcher), window)


def load(path: Path = SPEC) -> list[SLO]:
    """The SLOs in ``path``; raises ValueError for a target that cannot be met exactly."""
    spec = yaml.safe_load(path.read_text())
    window = spec["window"]
    seconds(window)
    slos = []
    for entry in spec["slos"]:
        common = {key: entry[key] for key in ("name", "title", "objective", "description")}
        if not 0 < common["objective"] < 1:
            raise ValueError(f"{entry['name']}: objective must be a share between 0 and 1")
        if "latency" in entry:
            latency = entry["latency"]
            if float(latency["threshold_seconds"]) not in LATENCY_BUCKETS:
                raise ValueError(
                    f"{entry['name']}: threshold_seconds {latency['threshold_seconds']} is not a bucket boundary "
                    "of LATENCY_BUCKETS (server/config_values.py), so good events could not be counted exactly"
                )
            slos.append(SLO(**common, window=window, histogram=latency["histogram"],
                            threshold_seconds=float(latency["threshold_seconds"])))  # fmt: skip
        else:
            slos.append(SLO(**common, window=window, bad=tuple(entry["events"]["bad"]), total=entry["events"]["total"]))
    return slos


def burn_rate(alert_window: tuple[float, str, str], slo_window: str) -> float:
    """The burn rate at which ``budget share`` of the budget goes within the long window."""
    share, long, _ = alert_window
    return round(share * seconds(slo_window) / seconds(long), 4)
