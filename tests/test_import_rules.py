"""The house's import rules (docs/architecture.md), read from the source: which room may import which."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# room -> module prefixes it must never import, anywhere in its files (imports inside functions included)
FORBIDDEN = {
    "kernels": ("server", "telemetry", "prometheus_client", "opentelemetry", "structlog", "fastapi"),
    "server/models": ("server.engine", "server.api", "telemetry", "prometheus_client", "opentelemetry", "structlog"),
    "server/engine": ("server.api", "telemetry", "prometheus_client", "opentelemetry", "structlog", "fastapi",
                      "llguidance", "xgrammar"),
    "telemetry": ("server.api", "server.models", "fastapi"),
    "server/distributed": ("server.api", "telemetry", "prometheus_client", "opentelemetry", "structlog", "fastapi"),
}


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_no_room_imports_what_the_house_rules_forbid(room):
    files = sorted((ROOT / room).rglob("*.py"))
    assert files
    broken = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in sorted(imported_modules(path))
        if any(name == prefix or name.startswith(prefix + ".") for prefix in FORBIDDEN[room])
    ]
    assert not broken, "\n".join(broken)


def test_the_load_tester_and_the_configs_load_neither_torch_nor_the_engine():
    probe = (
        "import sys; import server, server.config, server.bench.serve.cli, server.api.protocol; "
        "print(sorted(m for m in ('torch', 'server.engine.engine', 'server.llm') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
