"""The instruction-set variants the CPU kernels are built in, at install (setup.py), and the one this CPU runs.

Each variant is the same C++ sources compiled for one x86-64 level; the sources pick their code paths by the
compiler's feature macros. ``VIGIL_CPU_ISA`` forces a variant at or below the best this CPU can execute.
"""

import importlib.util
import os
from dataclasses import dataclass

from kernels.isa import cpu_flags

ISA_ENVIRONMENT_VARIABLE = "VIGIL_CPU_ISA"
_AVX512 = ("-march=x86-64-v4", "-mavx512vnni", "-mprefer-vector-width=512")


@dataclass(frozen=True)
class CpuVariant:
    name: str
    cpu_flags: frozenset[str]  # as /proc/cpuinfo names them
    compiler_flags: tuple[str, ...]

    @property
    def module(self) -> str:
        return f"kernels._cpu_{self.name}"


_V3 = frozenset({"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"})
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}
# Lowest first.
VARIANTS = (
    CpuVariant("avx2", _V3, ("-march=x86-64-v3",)),
    CpuVariant("avx512", _V4, _AVX512),
    CpuVariant("avx512_bf16", _V4 | {"avx512_bf16"}, (*_AVX512, "-mavx512bf16")),
    CpuVariant("amx", _V4 | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"},
               (*_AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mamx-int8")),
)
VARIANT_NAMES = tuple(variant.name for variant in VARIANTS)


class UnusableVariant(ValueError):
    pass


def executable_variants(flags: frozenset[str] | None = None) -> tuple[CpuVariant, ...]:
    """The variants this CPU (or one with ``flags``) can run, lowest first."""
    flags = cpu_flags() if flags is None else flags
    return tuple(variant for variant in VARIANTS if variant.cpu_flags <= flags)


def missing_variants() -> list[str]:
    """The variants whose module the install did not build (found without importing, so on any CPU)."""
    return [variant.name for variant in VARIANTS if importlib.util.find_spec(variant.module) is None]


def chosen_variant() -> CpuVariant | None:
    """``VIGIL_CPU_ISA``'s variant, else the best this CPU can run; None on a CPU below x86-64-v3. Raises
    UnusableVariant, one line, for an unknown name or one this CPU cannot execute."""
    usable = executable_variants()
    forced = os.environ.get(ISA_ENVIRONMENT_VARIABLE)
    if not forced:
        return usable[-1] if usable else None
    by_name = {variant.name: variant for variant in VARIANTS}
    if forced not in by_name:
        raise UnusableVariant(f"{ISA_ENVIRONMENT_VARIABLE}={forced} is not a CPU kernel variant; choose one of "
                              f"{', '.join(VARIANT_NAMES)}")
    if by_name[forced] not in usable:
        missing = sorted(by_name[forced].cpu_flags - cpu_flags())
        raise UnusableVariant(f"{ISA_ENVIRONMENT_VARIABLE}={forced} needs CPU features this CPU lacks: "
                              f"{', '.join(missing)}")
    return by_name[forced]
