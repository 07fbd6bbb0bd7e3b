"""The CPU fast path: a compiled C++ decode-attention kernel that reads K/V in place from their blocks.

It is built on first use with the machine's C++ compiler (cached by torch under TORCH_EXTENSIONS_DIR).
Where no compiler is available, ``load`` returns None and the torch reference serves instead.
"""

import hashlib
import logging
from functools import cache
from pathlib import Path
from types import ModuleType

logger = logging.getLogger("vigil.kernels")

SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.cpp"


def _cpu_tag() -> str:
    """The build targets this CPU (-march=native), so the cache key includes its feature flags."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return hashlib.sha256((flags + SOURCE.read_text()).encode()).hexdigest()[:12]


@cache
def load() -> ModuleType | None:
    from torch.utils import cpp_extension

    try:
        return cpp_extension.load(
            name=f"vigil_cpu_attention_{_cpu_tag()}",
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as error:  # noqa: BLE001 - no compiler or ninja: fall back to the torch path
        logger.warning("CPU attention kernel unavailable, using the torch path: %s", error)
        return None
