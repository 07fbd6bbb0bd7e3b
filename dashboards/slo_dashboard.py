"""The SLO dashboard: per SLO of alerts/slo.yml, the error budget left over its window, the SLI, the burn rate
over every window the alerts use, and the budget consumed while a burn-rate alert fired. Those read the series
that alerts/rules/slo.yml records across every replica; a last row splits each SLO's error ratio by replica (the
instance variable), to find the replica that spends the budget."""

from alerts.slo import BURN_RATE_ALERTS, SLO, WINDOWS, burn_rate, series
from dashboards.panels import dashboard, query_variable, row, stat, target, thresholds, timeseries

BY_REPLICA = 'instance=~"$instance"'


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


def rate_by_instance(selector: str, suffix: str = "", *matchers: str) -> str:
    return f"sum by (instance) (rate({series(selector, suffix, BY_REPLICA, *matchers)}[$__rate_interval]))"


def error_ratio_by_replica(slo: SLO) -> str:
    """Bad events over all events, per selected replica, now. A bad-event counter a replica has not written yet
    counts 0 there (``or 0 *`` its total), so that the sum keeps every replica."""
    if slo.histogram:
        good = rate_by_instance(slo.histogram, "_bucket", f'le="{slo.le}"')
        return f"1 - {good}\n/ {rate_by_instance(slo.histogram, '_count')}"
    total = rate_by_instance(slo.total)
    bad = "\n  + ".join(f"({rate_by_instance(selector)} or 0 * {total})" for selector in slo.bad)
    return f"(\n  {bad}\n)\n/ {total}"


def replica_panels(slos: list[SLO]) -> list[dict]:
    return [
        row("By replica (the selected instances)"),
        *(
            timeseries(
                f"{slo.title}: error ratio by replica",
                f"Share of each replica's events that are bad now; the objective allows {slo.budget:.1%}.",
                [target(error_ratio_by_replica(slo), "{{instance}}")],
                "percentunit",
                width=8,
                min_value=0,
                limits=thresholds("green", slo.budget, "red"),
            )
            for slo in slos
        ),
    ]


def slo_dashboard(slos: list[SLO]) -> dict:
    board = dashboard(
        "vigil-slo",
        "SLO",
        "Error budgets and burn rates of the SLOs in alerts/slo.yml across every replica, and each SLO by replica.",
        [*(panel for slo in slos for panel in slo_panels(slo)), *replica_panels(slos)],
        filtered=False,
    )
    board["templating"]["list"].append(
        query_variable("instance", "Instance", "label_values(vigil_engine_ready, instance)")
    )
    return board
