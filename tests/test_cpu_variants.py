"""The C++ kernels are built at install in every ISA variant, and the best one this CPU runs is chosen when they
load; ``VIGIL_CPU_ISA`` forces a lower one, and one this CPU cannot run is one clear line. Nothing is compiled
at run time. (Each variant's kernels against the torch oracle: test_kernels_cpu.py.)"""

import subprocess
import sys
from pathlib import Path

import pytest

from kernels import cpu
from kernels.cpu_variants import VARIANTS, UnusableVariant, chosen_variant, executable_variants
from kernels.isa import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
EXECUTABLE = executable_variants()
BEYOND_THIS_CPU = [variant for variant in VARIANTS if variant not in EXECUTABLE]


def test_every_variant_this_cpu_runs_was_built_at_install():
    assert EXECUTABLE, "the test machines are x86-64-v3 or better"
    for variant in EXECUTABLE:
        module = cpu.load_variant(variant)
        assert module is not None and Path(module.__file__).parent == ROOT / "kernels", variant


def test_the_best_variant_is_chosen_unless_one_is_forced(monkeypatch):
    monkeypatch.delenv("VIGIL_CPU_ISA", raising=False)
    assert chosen_variant() == EXECUTABLE[-1]
    flags = cpu_flags()
    expected = "amx" if "amx_tile" in flags else "avx512_bf16" if "avx512_bf16" in flags else \
        "avx512" if "avx512f" in flags else "avx2"
    assert chosen_variant().name == expected
    for variant in EXECUTABLE:
        monkeypatch.setenv("VIGIL_CPU_ISA", variant.name)
        assert chosen_variant() == variant


def test_an_unknown_variant_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setenv("VIGIL_CPU_ISA", "sse9")
    with pytest.raises(UnusableVariant, match="choose one of avx2, avx512, avx512_bf16, amx"):
        chosen_variant()


@pytest.mark.skipif(not BEYOND_THIS_CPU, reason="this CPU runs every variant")
def test_a_variant_beyond_this_cpu_is_one_line_and_exit_2():
    variant = BEYOND_THIS_CPU[0]
    result = subprocess.run([sys.executable, "-m", "server", "generate", "hi"], cwd=ROOT,
                            env={"PATH": "/usr/bin:/bin", "VIGIL_CPU_ISA": variant.name}, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert f"VIGIL_CPU_ISA={variant.name} needs CPU features this CPU lacks" in line


def test_loading_the_kernels_starts_no_compiler(tmp_path):
    """With no compiler on PATH and an empty torch extensions folder, every variant still loads."""
    check = ("from kernels import cpu; from kernels.cpu_variants import executable_variants; "
             "assert all(cpu.load_variant(v) is not None for v in executable_variants()); "
             "assert cpu.load() is not None")
    environment = {"PATH": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", check], env=environment, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not any(tmp_path.iterdir())


def test_an_install_without_the_kernels_serves_on_the_torch_path_and_says_so():
    """As after an install on a machine without a compiler: the variant's module is missing (the best this CPU
    runs, or VIGIL_CPU_ISA's where the suite runs with one forced)."""
    chosen = chosen_variant()
    missing = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.modules[sys.argv[1]] = None\n"  # an import of it now fails, as for a module never built
         "from kernels import cpu; print(cpu.load(), cpu.variant_name())", chosen.module],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout.split() == ["None", "torch"]
    [warning] = [line for line in missing.stderr.splitlines() if "were not built at install" in line]
    assert f"CPU kernels ({chosen.name})" in warning and "torch path" in warning
