"""The CPU fast path: compiled C++ kernels for paged decode and prefill attention (K/V read in place from their
blocks), the KV store, a layer's elementwise ops, quantised linear layers and decoding's bf16 matrix products.

It is built on first use with the machine's C++ compiler, into a folder under TORCH_EXTENSIONS_DIR (or torch's
default cache) named by everything the build depends on. Where no compiler is available, ``load`` returns None
and the torch reference serves instead.
"""

import fcntl
import hashlib
import logging
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from kernels.isa import cpu_flags

logger = logging.getLogger("vigil.kernels")

SOURCE_DIR = Path(__file__).parent / "csrc"
SOURCES = (
    "paged_decode_attention.cpp", "paged_decode_bf16.cpp", "paged_prefill_attention.cpp", "paged_prefill_bf16.cpp",
    "store_kv.cpp", "layer_ops.cpp", "quantized_linear.cpp", "few_rows_linear.cpp", "amx_linear.cpp",
    "greedy_tokens.cpp", "decode_layers.cpp", "bindings.cpp",
)
# -fno-trapping-math lets GCC vectorise loops with float selects (SiLU, exp, max); results are unchanged, only
# floating-point exception flags are no longer kept exact. Without it those loops ran one lane at a time.
CFLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp")


def _build_tag() -> str:
    """The build targets this CPU (-march=native), this Python and this torch, so the cache key includes them,
    the compiler flags and the sources."""
    import torch

    flags = " ".join(sorted(cpu_flags()))
    sources = "".join(path.read_text() for path in sorted(SOURCE_DIR.iterdir()))
    identity = " ".join((flags, sys.version, torch.__version__, *CFLAGS, sources))
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def _build_directory(name: str) -> Path:
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / name


@cache
def load() -> ModuleType | None:
    from torch.utils import cpp_extension

    name = f"vigil_cpu_kernels_{_build_tag()}"
    try:
        build_directory = _build_directory(name)
        build_directory.mkdir(parents=True, exist_ok=True)
        # torch's own build lock is a file that outlives a process killed mid-build, after which every later
        # build waits on it forever. An flock is released by the kernel when its holder dies, so under it any
        # torch lock file left behind is stale.
        with open(build_directory / "vigil.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (build_directory / "lock").unlink(missing_ok=True)
            return cpp_extension.load(
                name=name,
                sources=[str(SOURCE_DIR / source) for source in SOURCES],
                extra_cflags=list(CFLAGS),
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_directory),
            )
    except Exception as error:  # noqa: BLE001 - no compiler or ninja: fall back to the torch path
        logger.warning("CPU kernels unavailable, using the torch path: %s", error)
        return None
