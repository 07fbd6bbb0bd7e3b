"""``vigil top``: the live console in a terminal, against any Vigil server's /console/data.json."""

import argparse
import logging
import os
import time
from collections.abc import Callable

import httpx
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

SPARKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
KEEP_S = 120
STATE_STYLES = {"ok": "green", "warning": "bold yellow", "critical": "bold red"}


def _seconds(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _percent(v: float) -> str:
    return f"{v * 100:.1f}%"


def _bytes(v: float) -> str:
    return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.1f} MiB"


def _number(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}"


# panel -> (label, series, format, the indicator that colours it)
ROWS: dict[str, list[tuple[str, str, Callable[[float], str], str | None]]] = {
    "Service": [
        ("requests/s 2xx", "requests_2xx", _number, None),
        ("requests/s 5xx", "requests_5xx", _number, "server_error_share"),
        ("running", "running", _number, None),
        ("waiting", "waiting", _number, "waiting"),
        ("TTFT P50", "ttft_p50", _seconds, None),
        ("TTFT P99", "ttft_p99", _seconds, "ttft_slo"),
        ("inter-token P50", "itl_p50", _seconds, None),
        ("inter-token P99", "itl_p99", _seconds, "itl_slo"),
        ("queue P95", "queue_p95", _seconds, "queue_time_over_p95_line_share"),
        ("batch (seqs) P50", "batch_seqs_p50", _number, None),
        ("KV used", "kv_usage", _percent, "kv_usage"),
        ("prefix hits", "prefix_hit_rate", _percent, None),
        ("preemptions/s", "preemptions", _number, "preemptions_per_minute"),
        ("errors/s", "errors", _number, None),
    ],
    "Model": [
        ("output tokens/s", "output_tokens", _number, None),
        ("prompt tokens/s", "prompt_tokens", _number, None),
        ("decode speed P50", "decode_speed_p50", _number, None),
        ("output length P50", "output_len_p50", _number, None),
        ("finished/s", "finished", _number, "length_finish_share"),
        ("repetition", "repetition_mean", _number, "repetition_loop_share"),
        ("spec acceptance", "spec_acceptance", _percent, None),
    ],
    "Infrastructure": [
        ("host CPU", "host_cpu", _percent, None),
        ("host memory", "host_memory_used", _bytes, None),
        ("server RSS", "rss_bytes", _bytes, None),
    ],
}
GPU_ROWS = (("temperature", _number), ("utilization", _percent), ("memory_used", _bytes), ("power", _number))


def sparkline(values: list[float | None]) -> str:
    shown = values[-SPARK_WIDTH:]
    present = [v for v in shown if v is not None]
    if not present:
        return ""
    low, high = min(present), max(present)
    span = (high - low) or 1.0
    return "".join(" " if v is None else SPARKS[int((v - low) / span * (len(SPARKS) - 1))] for v in shown)


class SeriesWindow:
    """The rows fetched so far, the last KEEP_S seconds of them."""

    def __init__(self) -> None:
        self.t: list[int] = []
        self.series: dict[str, list[float | None]] = {}

    @property
    def last(self) -> int | None:
        return self.t[-1] if self.t else None

    def merge(self, data: dict) -> None:
        self.t += data["t"]
        for name, values in data["series"].items():
            self.series[name] = self.series.get(name, []) + values
        cut = next((i for i, second in enumerate(self.t) if second > data["now"] - KEEP_S), len(self.t))
        self.t = self.t[cut:]
        self.series = {name: values[cut:] for name, values in self.series.items()}

    def latest(self, name: str) -> float | None:
        return next((v for v in reversed(self.series.get(name, [])) if v is not None), None)


def panel(title: str, rows: list, window: SeriesWindow, states: dict[str, str]) -> Table:
    table = Table(title=title, title_justify="left", expand=True, show_header=False, box=None)
    table.add_column(width=18)
    table.add_column(width=12, justify="right")
    table.add_column(width=SPARK_WIDTH)
    for label, name, fmt, indicator in rows:
        value = window.latest(name)
        style = STATE_STYLES[states.get(indicator, "ok")] if indicator else ""
        table.add_row(label, Text("–" if value is None else fmt(value), style=style),
                      Text(sparkline(window.series.get(name, [])), style="cyan"))
    return table


def render(data: dict, window: SeriesWindow, url: str) -> Group:
    states = {i["name"]: i["state"] for i in data["indicators"]}
    header = Text(f"vigil top  {url}  version {data['server']['version']}  up {data['server']['uptime_s'] // 60} min")
    models = Text(" · ".join(f"{name}: {m['engine']['dtype']} {m['engine']['quantization']} "
                             f"{m['engine']['attention_backend']}/{m['engine']['cpu_kernels']}, KV "
                             f"{_bytes(m['kv_cache']['total_bytes'])}" for name, m in data["models"].items()))
    chips = Text()
    for indicator in data["indicators"]:
        chips.append(f" {indicator['name']} ", style=f"reverse {STATE_STYLES[indicator['state']]}")
        chips.append(" ")
    gpus = sorted({name.split("_")[0] for name in data["series"] if name.startswith("gpu")})
    infra = ROWS["Infrastructure"] + [(f"{gpu} {field}", f"{gpu}_{field}", fmt, f"{gpu}_temperature")
                                      for gpu in gpus for field, fmt in GPU_ROWS]
    panels = [panel("Service", ROWS["Service"], window, states), panel("Model", ROWS["Model"], window, states),
              panel("Infrastructure", infra, window, states)]
    requests = Table(title="Recent requests", title_justify="left", expand=True)
    for column in ("id", "model", "prompt", "output", "TTFT", "duration", "finish"):
        requests.add_column(column)
    for row in data["requests"][:8]:
        requests.add_row(row["id"], row["model"], str(row["prompt_tokens"]), str(row["output_tokens"]),
                         "–" if row["ttft_s"] is None else _seconds(row["ttft_s"]),
                         "–" if row["duration_s"] is None else _seconds(row["duration_s"]), row["finish_reason"])
    ring = data["ring"]
    footer = Text(f"ring: {ring['capacity_rows']} rows of {ring['fields']} series, {_bytes(ring['bytes'])}",
                  style="dim")
    return Group(header, models, chips, *panels, requests, footer)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("top", help="the live console in a terminal, against a running server")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's address")
    parser.add_argument("--api-key", default=os.environ.get("VIGIL_API_KEY"),
                        help="sent as a bearer token where the console is guarded (also VIGIL_API_KEY)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per poll would scroll the view away
    url = args.url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    window = SeriesWindow()
    client = httpx.Client(base_url=url, headers=headers, timeout=10)
    with client, Live(screen=True, auto_refresh=False) as live:
        try:
            while True:
                params = {} if window.last is None else {"since": window.last}
                response = client.get("/console/data.json", params=params)
                if response.status_code == 401:
                    raise ValueError(f"{url} guards its console: give --api-key")
                response.raise_for_status()
                data = response.json()
                window.merge(data)
                live.update(render(data, window, url), refresh=True)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
