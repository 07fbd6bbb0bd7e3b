"""The SLO dashboard: per SLO of alerts/slo.yml, the error budget left over its window, the SLI, the burn rate
over every window the alerts use, and the budget consumed while a burn-rate alert fired. It reads the series
that alerts/rules/slo.yml records, across every replica, so it has no model or instance selector."""

from alerts.slo import BURN_RATE_ALERTS, SLO, WINDOWS, burn_rate
from dashboards.panels import dashboard, row, stat, target, thresholds, timeseries


def over_window(record: str, slo: SLO, window: str) -> str:
    return f'sum_over_time({record}{{slo="{slo.name}"}}[{window}])'


def error_ratio(slo: SLO) -> str:
    """Bad events over all events in the SLO's window: the 5-minute rates recorded every evaluation, summed."""
    return (
        f"{over_window('slo:bad_events:rate5m', slo, slo.window)}\n"
        f"/ {over_window('slo:events:rate5m', slo, slo.window)}"
    )


def burn_rate_limits(slo: SLO) -> dict:
    """Dashed lines at the burn rates where the alerts open a ticket (yellow, orange) and page (red)."""
    rates = sorted({burn_rate(pair, slo.window) for alert in BURN_RATE_ALERTS for pair in alert.windows})
    colours = ("yellow", "orange", "red", "dark-red")
    return thresholds("green", *(step for pair in zip(rates, colours, strict=True) for step in pair))


def budget_consumed_in_incidents(slo: SLO) -> str:
    """The share of the window's budget that the bad events of each interval used, while one of the SLO's
    burn-rate alerts fired; 0 outside incidents."""
    selector = f'{{slo="{slo.name}"}}'
    return (
        f"(\n  {over_window('slo:bad_events:rate5m', slo, '$__interval')}\n"
        f"  / on (slo) ({slo.budget:g} * {over_window('slo:events:rate5m', slo, slo.window)})\n"
        f'  and on (slo) max by (slo) (ALERTS{{alertstate="firing", slo="{slo.name}"}})\n'
        f")\nor on (slo) 0 * slo:events:rate5m{selector}"
    )


def slo_panels(slo: SLO) -> list[dict]:
    threshold = f", threshold {slo.threshold_seconds:g} s" if slo.histogram else ""
    return [
        row(f"{slo.title}: {slo.objective:.1%} good over {slo.window}{threshold}"),
        stat(
            f"{slo.title}: error budget left ({slo.window})",
            f"{slo.description} Share of the {slo.window} error budget ({slo.budget:.1%} of events) not yet spent.",
            f"1 - ({error_ratio(slo)}) / {slo.budget:g}",
            "percentunit",
            thresholds("red", 0, "orange", 0.25, "green"),
            width=4,
        ),
        stat(
            f"{slo.title}: good events ({slo.window})",
            f"Share of good events over {slo.window}; the objective is {slo.objective:.1%}.",
            f"1 - ({error_ratio(slo)})",
            "percentunit",
            thresholds("red", slo.objective, "green"),
            width=4,
        ),
        timeseries(
            f"{slo.title}: burn rate",
            "How many times faster than the budget allows bad events come, over each window the alerts use. "
            "The dashed lines are the alerts' burn rates: a ticket above 1 (3 days) and 3 (1 day), a page above "
            "6 (6 hours) and 14.4 (1 hour), each also over its short window.",
            [
                target(f'slo:error_ratio:rate{window}{{slo="{slo.name}"}} / {slo.budget:g}', window)
                for window in WINDOWS
            ],
            "x",
            width=8,
            min_value=0,
            limits=burn_rate_limits(slo),
        ),
        timeseries(
            f"{slo.title}: budget consumed per incident",
            f"Bars: the share of the {slo.window} budget spent in each interval while a burn-rate alert for this "
            "SLO fired. The legend's total is what the incidents in view consumed: narrow the time range to one "
            "incident to read its cost.",
            [target(budget_consumed_in_incidents(slo), "budget consumed")],
            "percentunit",
            width=8,
            min_value=0,
            bars=True,
            legend_calcs=("sum",),
        ),
    ]


def slo_dashboard(slos: list[SLO]) -> dict:
    return dashboard(
        "vigil-slo",
        "SLO",
        "Error budgets and burn rates of the SLOs in alerts/slo.yml, across every replica.",
        [panel for slo in slos for panel in slo_panels(slo)],
        filtered=False,
    )
