"""The results as a table on stdout (side by side when comparing, with ratios) and as a JSON file."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from server.bench.serve.client import Target
from server.bench.serve.runner import RunResult
from server.bench.serve.summary import Summary

LATENCIES = (("Time to first token", "TTFT", "ttft"), ("Time per output token (excl. 1st)", "TPOT", "tpot"),
             ("Inter-token latency", "ITL", "itl"), ("End-to-end latency", "E2EL", "e2el"))
STATS = (("Mean", "mean"), ("Median", "median"), ("P90", "p90"), ("P99", "p99"))
KEY_FIGURES = ("Request throughput (req/s)", "Output token throughput (tok/s)", "Total token throughput (tok/s)",
               "Goodput (req/s)", "Mean TTFT (ms)", "P99 TTFT (ms)", "Mean TPOT (ms)", "Mean ITL (ms)",
               "Mean E2EL (ms)", "P99 E2EL (ms)")
NAME_WIDTH = 36
VALUE_WIDTH = 12

Figure = tuple[str, str, float | None]  # section, name, value


@dataclass
class Side:
    label: str
    target: Target
    run: RunResult
    summary: Summary


def figures(summary: Summary) -> list[Figure]:
    totals = [("Successful requests", summary.completed), ("Failed requests", summary.failed),
              ("Benchmark duration (s)", summary.duration_s), ("Total input tokens", summary.input_tokens),
              ("Total output tokens", summary.output_tokens),
              ("Request throughput (req/s)", summary.request_throughput),
              ("Output token throughput (tok/s)", summary.output_throughput),
              ("Total token throughput (tok/s)", summary.total_token_throughput)]
    if summary.goodput is not None:
        totals.append(("Goodput (req/s)", summary.goodput))
    rows: list[Figure] = [("Serving benchmark", name, value) for name, value in totals]
    for title, short, field in LATENCIES:
        distribution = getattr(summary, field)
        rows += [(title, f"{stat} {short} (ms)", getattr(distribution, key) if distribution else None)
                 for stat, key in STATS]
    return rows


def print_tables(sides: list[Side]) -> None:
    print()
    for side in sides:
        print(f"{side.label}: {side.target.base_url}, model {side.target.model}, {side.target.endpoint}")
    print(f"{'':{NAME_WIDTH}}" + "".join(f"{side.label:>{VALUE_WIDTH}}" for side in sides))
    columns = [figures(side.summary) for side in sides]
    section = None
    for rows in zip(*columns, strict=True):
        if rows[0][0] != section:
            section = rows[0][0]
            print(f"{' ' + section + ' ':-^{NAME_WIDTH + VALUE_WIDTH * len(sides)}}")
        print(f"{rows[0][1]:{NAME_WIDTH}}" + "".join(f"{number(value):>{VALUE_WIDTH}}" for _, _, value in rows))
    for side in sides:
        for reason, count in side.summary.failures.items():
            print(f"failed on {side.label}: {count} x {reason}")


def ratios(a: Summary, b: Summary) -> dict[str, dict[str, float | None]]:
    values_a = {name: value for _, name, value in figures(a)}
    values_b = {name: value for _, name, value in figures(b)}
    return {name: {"B/A": divide(values_b[name], values_a[name]), "A/B": divide(values_a[name], values_b[name])}
            for name in KEY_FIGURES if name in values_a}


def print_ratios(table: dict[str, dict[str, float | None]]) -> None:
    print(f"{' Ratios ':-^{NAME_WIDTH + VALUE_WIDTH * 2}}")
    print(f"{'':{NAME_WIDTH}}{'B ÷ A':>{VALUE_WIDTH}}{'A ÷ B':>{VALUE_WIDTH}}")
    for name, pair in table.items():
        print(f"{name:{NAME_WIDTH}}" + "".join(f"{number(pair[key], 'x'):>{VALUE_WIDTH}}" for key in ("B/A", "A/B")))


def divide(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def number(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value}{suffix}" if isinstance(value, int) else f"{value:.2f}{suffix}"


def write_json(path: Path, config: dict, sides: list[Side], ratio_table: dict | None) -> None:
    results = {
        side.label: {
            "base_url": side.target.base_url, "model": side.target.model, "endpoint": side.target.endpoint,
            "summary": dataclasses.asdict(side.summary),
            "requests": [dataclasses.asdict(record) for record in side.run.records],
        }
        for side in sides
    }
    document = {"config": config, "results": results}
    if ratio_table is not None:
        document["ratios"] = ratio_table
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
