"""Loads the compiled C++ CPU kernels: imports the module of the instruction-set variant (cpu_variants.py) this
CPU runs best, or the one ``VIGIL_CPU_ISA`` names, and says which one serves.

The kernels themselves (paged decode and prefill attention reading K/V in place from their blocks, the KV store,
a layer's elementwise ops, quantised linear layers and decoding's bf16 matrix products) are the C++ sources in
csrc/, compiled by setup.py at install, one module per variant; nothing here compiles. Where the variant was not
built (no compiler at install) or the CPU is below x86-64-v3, ``load`` returns None, says so in one warning line,
and the torch reference serves instead.
"""

import importlib
import logging
from functools import cache
from types import ModuleType

from kernels.cpu_variants import CpuVariant, chosen_variant

logger = logging.getLogger("vigil.kernels")


@cache
def load_variant(variant: CpuVariant) -> ModuleType | None:
    """That variant's module, or None where the install did not build it."""
    import torch  # noqa: F401 - the extension links against torch's libraries, loaded by importing torch

    try:
        return importlib.import_module(variant.module)
    except ImportError as error:
        logger.warning("CPU kernels (%s) were not built at install, using the torch path: %s", variant.name, error)
        return None


@cache
def load() -> ModuleType | None:
    """The chosen variant's kernels; raises cpu_variants.UnusableVariant for a ``VIGIL_CPU_ISA`` this CPU cannot
    use."""
    variant = chosen_variant()
    if variant is None:
        logger.warning("this CPU lacks AVX2, FMA or F16C (x86-64-v3): no CPU kernel variant runs here, using the "
                       "torch path")
        return None
    return load_variant(variant)


def variant_name() -> str:
    """The chosen variant's name, or "torch" where the torch path serves: for logs, metrics and bench lines."""
    variant = chosen_variant()
    return variant.name if variant is not None and load_variant(variant) is not None else "torch"

