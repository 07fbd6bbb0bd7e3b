"""The CPU fast path: compiled C++ kernels for paged decode and prefill attention (K/V read in place from their
blocks), the KV store and a layer's elementwise ops.

It is built on first use with the machine's C++ compiler (cached by torch under TORCH_EXTENSIONS_DIR).
Where no compiler is available, ``load`` returns None and the torch reference serves instead.
"""

import hashlib
import logging
from functools import cache
from pathlib import Path
from types import ModuleType

logger = logging.getLogger("vigil.kernels")

SOURCE_DIR = Path(__file__).parent / "csrc"
SOURCES = (
    "paged_decode_attention.cpp", "paged_prefill_attention.cpp", "store_kv.cpp", "layer_ops.cpp",
    "quantized_linear.cpp", "bindings.cpp",
)
# -fno-trapping-math lets GCC vectorise loops with float selects (SiLU, exp, max); results are unchanged, only
# floating-point exception flags are no longer kept exact. Without it those loops ran one lane at a time.
CFLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp")


def _cpu_tag() -> str:
    """The build targets this CPU (-march=native), so the cache key includes its feature flags, the compiler
    flags and the sources."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    sources = "".join(path.read_text() for path in sorted(SOURCE_DIR.iterdir()))
    return hashlib.sha256((flags + " ".join(CFLAGS) + sources).encode()).hexdigest()[:12]


@cache
def load() -> ModuleType | None:
    from torch.utils import cpp_extension

    try:
        return cpp_extension.load(
            name=f"vigil_cpu_kernels_{_cpu_tag()}",
            sources=[str(SOURCE_DIR / name) for name in SOURCES],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
        )
    except Exception as error:  # noqa: BLE001 - no compiler or ninja: fall back to the torch path
        logger.warning("CPU kernels unavailable, using the torch path: %s", error)
        return None
