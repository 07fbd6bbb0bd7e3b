"""Two PNGs per benchmark: the latency CDF (TTFT and end-to-end) and output tokens/s over time."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from server.bench.serve.runner import RunResult  # noqa: E402

# One-second bins, but at least this many bins for a short run.
MIN_BINS = 20


def latency_cdf(runs: dict[str, RunResult], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(8, 5))
    for label, run in runs.items():
        done = [r for r in run.records if r.ok]
        for name, values in (("TTFT", [r.ttft_s for r in done if r.ttft_s is not None]),
                             ("E2EL", [r.latency_s for r in done])):
            if values:
                ms = np.sort(np.asarray(values)) * 1000.0
                axes.step(ms, np.arange(1, len(ms) + 1) / len(ms), where="post", label=f"{label} {name}")
    axes.set(xlabel="latency (ms)", ylabel="fraction of requests", title="Latency CDF", ylim=(0, 1.02))
    save(figure, axes, path)


def throughput_over_time(runs: dict[str, RunResult], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(8, 5))
    for label, run in runs.items():
        bin_s = min(1.0, run.duration_s / MIN_BINS)
        edges = np.arange(0.0, run.duration_s + bin_s, bin_s)
        times, weights = token_times(run)
        counts, _ = np.histogram(times, bins=edges, weights=weights)
        axes.stairs(counts / bin_s, edges, label=label)
    axes.set(xlabel="seconds since the start", ylabel="output tokens/s", title="Output throughput")
    save(figure, axes, path)


def token_times(run: RunResult) -> tuple[np.ndarray, np.ndarray]:
    """When each text chunk arrived, weighted so that a request's chunks add up to its output tokens."""
    times: list[float] = []
    weights: list[float] = []
    for record in run.records:
        if not record.ok or record.ttft_s is None:
            continue
        arrivals = record.start_s + record.ttft_s + np.concatenate(([0.0], np.cumsum(record.itl_s)))
        times += arrivals.tolist()
        weights += [record.output_tokens / len(arrivals)] * len(arrivals)
    return np.asarray(times), np.asarray(weights)


def save(figure: plt.Figure, axes: plt.Axes, path: Path) -> None:
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
