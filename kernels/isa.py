"""What this CPU is and which instruction sets it offers, as /proc/cpuinfo names them (empty off Linux)."""

from functools import cache
from pathlib import Path


@cache
def _first_processor() -> dict[str, str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            break
        if ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    return _first_processor().get("model name", "unknown CPU")


def cpu_flags() -> frozenset[str]:
    return frozenset(_first_processor().get("flags", "").split())
