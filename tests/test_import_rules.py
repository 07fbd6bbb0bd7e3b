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

# The configuration layer (flags -> EngineConfig / ServerConfig) sits below everything it configures: these files
# may import the standard library and each other, nothing that serves, measures or computes.
CONFIG_LAYER = ("server/config.py", "server/config_values.py", "server/engine_args.py", "server/serve_args.py",
                "server/serve_models.py", "server/bench/serve/options.py", "server/bench/routing_options.py")
CONFIG_LAYER_FORBIDS = ("server.api", "server.engine", "server.models", "server.distributed", "server.llm",
                        "telemetry", "kernels", "torch", "prometheus_client", "fastapi")


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


@pytest.mark.parametrize("module", CONFIG_LAYER)
def test_the_config_layer_imports_nothing_above_it(module):
    broken = [name for name in sorted(imported_modules(ROOT / module))
              if any(name == prefix or name.startswith(prefix + ".") for prefix in CONFIG_LAYER_FORBIDS)]
    assert not broken, f"{module} imports {', '.join(broken)}"


PACKAGES = ("server", "kernels", "telemetry")


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each project module -> the project modules it imports anywhere: at the top, inside functions, under
    TYPE_CHECKING (a cycle hidden by a lazy import is still a cycle in the design)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        edges.add(f"{base}.{alias.name}")
                    elif base in modules:
                        edges.add(base)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_takes_part_in_an_import_cycle():
    found = cycles(import_graph(project_modules()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(component) for component in found)


def test_the_cycle_check_sees_a_cycle_hidden_in_a_lazy_or_type_checking_import(tmp_path):
    package = tmp_path / "server"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text("def later():\n    from server.second import thing\n")
    (package / "second.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from . import first\nthing = 1\n")
    modules = {"server": package / "__init__.py", "server.first": package / "first.py",
               "server.second": package / "second.py"}
    assert cycles(import_graph(modules)) == [["server.first", "server.second"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_load_tester_and_the_configs_load_neither_torch_nor_the_engine():
    probe = (
        "import sys; import server, server.config, server.engine_args, server.serve_args, server.serve_models, "
        "server.bench.serve.cli, server.bench.routing_options, server.api.protocol; "
        "print(sorted(m for m in ('torch', 'server.engine.engine', 'server.llm', 'telemetry', 'server.api.app') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
