"""The built wheel carries every file the packages open at run time, and a server installed from it runs
``bench quant --help`` and measures a perplexity on its shipped text.

The wheel is built from a copy of the sources as the Dockerfile copies them, with setuptools' own commands but
without compiling the C++ kernels (``bdist_wheel --skip-build`` after ``build_py``): the kernels are not package
data, and compiling every ISA variant takes minutes. Installed without them, the server runs its torch path."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "kernels", "telemetry")


def package_data_files() -> set[str]:
    """Every file under the packages that is not Python source, bytecode or a compiled kernel."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            parts = path.relative_to(ROOT).parts
            if path.is_file() and "__pycache__" not in parts and path.suffix not in {".py", ".pyc", ".so"}:
                found.add("/".join(parts))
    return found


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "bdist_wheel", "--skip-build", "--dist-dir",
                    str(dist)], cwd=source, check=True, capture_output=True)  # fmt: skip
    (wheel,) = dist.glob("*.whl")
    return wheel


def run_installed(site: Path, *args: str) -> str:
    """Python with the unpacked wheel first on its path, from a folder outside the repository."""
    done = subprocess.run([sys.executable, *args], cwd=site, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_wheel_carries_its_data_and_runs_bench_quant_and_a_perplexity(tmp_path, smollm_folder):
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        site = tmp_path / "site"
        archive.extractall(site)
    assert "server/bench/texts/perplexity.txt" in package_data_files()
    assert package_data_files() <= names, sorted(package_data_files() - names)

    assert "--methods" in run_installed(site, "-m", "server", "bench", "quant", "--help")
    out = run_installed(site, "-c", (
        "import server, sys; from server import LLM; from server.bench.perplexity import text_perplexity\n"
        f"llm = LLM(model={str(smollm_folder)!r}, dtype='float32', kv_cache_memory=32 * 2**20)\n"
        "print(server.__file__); print(text_perplexity(llm.engine))"
    ))
    module, perplexity = out.split()[-2:]
    assert Path(module).is_relative_to(site), "the package ran from the repository, not the wheel"
    assert 3 < float(perplexity) < 50
