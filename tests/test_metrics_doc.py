"""docs/metrics.md lists exactly the metrics telemetry/metrics.py defines, with their types and labels."""

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from telemetry.metrics import VigilMetrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(vigil_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def defined_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    metrics = VigilMetrics("m", CollectorRegistry())
    found = {}
    for metric in vars(metrics).values():
        if hasattr(metric, "_labelnames"):
            family = next(iter(metric.collect()))
            name = family.name + ("_total" if family.type == "counter" else "")
            found[name] = (family.type, tuple(metric._labelnames))
    return found


def documented_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    return {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels)))
        for name, kind, labels in ROW.findall(DOC.read_text())
    }


def test_every_metric_is_documented_with_its_type_and_labels_and_nothing_else():
    assert documented_metrics() == defined_metrics()


def test_names_follow_the_conventions():
    for name, (kind, _) in defined_metrics().items():
        assert name.startswith("vigil_") and ":" not in name
        assert name.endswith("_total") == (kind == "counter"), name
