"""The process's memory allocator: jemalloc where the system has it (Debian's libjemalloc2), preloaded by running
the command line again, once, with it in LD_PRELOAD, before anything heavy is imported; ``VIGIL_MALLOC=system``
keeps glibc's malloc. vLLM and PyTorch's CPU launcher likewise ask for tcmalloc or jemalloc in LD_PRELOAD.

Why: a decode step on the CPU makes about 2,000 allocations (tensors and their metadata, kernel scratch). glibc
serves those over 1 KiB, and every 64-byte aligned one (torch's tensor data), from its bins rather than its
per-thread cache, and on two cores that cost an int4 decode step at one stream 7-9% of its time
(docs/performance.md, "the allocator"). Standard library only: it runs before torch is imported."""

import ctypes.util
import os
import sys
from collections.abc import Mapping

ALLOCATOR_ENV = "VIGIL_MALLOC"
ALLOCATOR_CHOICES = ("jemalloc", "system")
_LIBRARIES = {"jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc"}


def jemalloc_library() -> str | None:
    """jemalloc's shared library as the dynamic loader finds it (``libjemalloc.so.2``), or None."""
    return ctypes.util.find_library("jemalloc")


def process_allocator(maps: str | None = None) -> str:
    """The allocator this process runs on: "jemalloc" or "tcmalloc" where one is mapped, else "system".
    ``maps``: the text of /proc/self/maps (read here when None)."""
    if maps is None:
        try:
            with open("/proc/self/maps", encoding="utf-8") as found:
                maps = found.read()
        except OSError:
            return "system"
    for name, library in _LIBRARIES.items():
        if f"/{library}" in maps:
            return name
    return "system"


def preloaded_environment(environ: Mapping[str, str], allocator: str, library: str | None) -> dict[str, str] | None:
    """The environment to run this command line again with, jemalloc preloaded, or None where it runs as it is:
    ``VIGIL_MALLOC=system``, jemalloc not installed, another allocator already in the process, or jemalloc already
    in LD_PRELOAD (where the loader could not preload it, running again would not either). ValueError for a
    ``VIGIL_MALLOC`` that is neither "jemalloc" nor "system"."""
    choice = environ.get(ALLOCATOR_ENV, "jemalloc")
    if choice not in ALLOCATOR_CHOICES:
        raise ValueError(f"{ALLOCATOR_ENV}={choice!r}: choose one of {', '.join(ALLOCATOR_CHOICES)}")
    preload = environ.get("LD_PRELOAD", "")
    if choice == "system" or library is None or allocator != "system" or library in preload:
        return None
    return {**environ, "LD_PRELOAD": f"{library}:{preload}" if preload else library}


def run_again_with_jemalloc() -> None:
    """Replaces this process by its own command line with jemalloc preloaded, where ``preloaded_environment``
    says so; returns otherwise. The process keeps its id, so supervisors and signals see no difference."""
    if not sys.platform.startswith("linux"):  # LD_PRELOAD is the Linux loader's
        return
    environment = preloaded_environment(os.environ, process_allocator(), jemalloc_library())
    if environment is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environment)
