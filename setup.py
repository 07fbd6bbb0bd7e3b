"""Builds the C++ CPU kernels at install, once per instruction-set variant (kernels/cpu_variants.py), as compiled
extensions of the package; kernels/cpu.py loads the best one this CPU runs. Everything else is in pyproject.toml.

Install without build isolation (``pip install --no-build-isolation``) so that the build uses the installed torch.
Without a compiler the install still succeeds, and the server runs on its torch path and says so.
"""

import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from kernels.cpu_variants import VARIANTS  # noqa: E402

# Relative, as setuptools requires.
SOURCES = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "kernels" / "csrc").glob("*.cpp"))
# -fno-trapping-math lets GCC vectorise loops with float selects (SiLU, exp, max); results are unchanged, only
# floating-point exception flags are no longer kept exact. Without it those loops ran one lane at a time.
# -g0 and the -Wno-* undo Python's own CFLAGS (-g -Wall): debug info doubled the build time and the modules' size,
# and GCC 12's AVX-512 headers alone raise a thousand false maybe-uninitialized warnings.
COMMON_FLAGS = ["-O3", "-fno-trapping-math", "-fopenmp", "-g0", "-Wno-maybe-uninitialized", "-Wno-uninitialized",
                "-Wno-ignored-attributes", "-Wno-attributes", "-Wno-unused-variable"]


def kernel_extensions() -> tuple[list, dict]:
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("vigil: torch is not installed in the build environment; install with --no-build-isolation after "
              "torch, or the server will use its torch path", file=sys.stderr)
        return [], {}

    class BuildKernelsOrWarn(BuildExtension):
        """One line per variant, and a failed build is a warning: the package works without the kernels."""

        def build_extension(self, extension) -> None:  # noqa: ANN001 - setuptools' Extension
            print(f"vigil: building the C++ CPU kernels for {extension.name} (once, at install)", file=sys.stderr,
                  flush=True)
            try:
                super().build_extension(extension)
            except Exception as error:  # noqa: BLE001 - no compiler, or one too old for this variant
                print(f"vigil: WARNING: {extension.name} did not build ({str(error).splitlines()[0][:200]}); the "
                      "server falls back to a lower variant or its torch path", file=sys.stderr, flush=True)

    extensions = [
        CppExtension(variant.module, SOURCES, extra_compile_args=[*COMMON_FLAGS, *variant.compiler_flags],
                     extra_link_args=["-fopenmp"])
        for variant in VARIANTS
    ]
    return extensions, {"build_ext": BuildKernelsOrWarn}


extensions, commands = kernel_extensions()
setup(ext_modules=extensions, cmdclass=commands)
