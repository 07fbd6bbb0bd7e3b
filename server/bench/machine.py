"""What a benchmark ran on: the CPU and the ISA it offers, the memory allocator, and the memory bandwidth that
bounds a batch-1 step."""

import time
from dataclasses import dataclass

import torch

from kernels import cpu
from kernels.isa import cpu_flags, cpu_model
from server.allocator import process_allocator

# The ISA that decides which kernels can be fast here, as /proc/cpuinfo names it.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
BANDWIDTH_PROBE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Machine:
    cpu: str
    isa: tuple[str, ...]
    cpu_kernels: str
    threads: int
    allocator: str  # server/allocator.py's name for this process's malloc
    read_bandwidth_bytes_per_second: float

    def describe(self) -> str:
        return (f"{self.cpu}, {self.threads} threads, ISA {' '.join(self.isa) or 'baseline'}, "
                f"CPU kernels {self.cpu_kernels}, allocator {self.allocator}, "
                f"read bandwidth {self.read_bandwidth_bytes_per_second / 1e9:.1f} GB/s")


def measure_read_bandwidth(repeats: int = 7) -> float:
    """Bytes per second that a reduction streams from memory, with every thread: the fastest of a few passes over
    a buffer much larger than any cache (as STREAM reports the best), since other work on the machine only slows
    a pass down."""
    buffer = torch.ones(BANDWIDTH_PROBE_BYTES // 4, dtype=torch.float32)
    buffer.sum()  # first touch: pages mapped before timing
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        seconds.append(time.perf_counter() - started)
    return BANDWIDTH_PROBE_BYTES / min(seconds)


def this_machine() -> Machine:
    flags = cpu_flags()
    return Machine(cpu_model(), tuple(flag for flag in ISA_FLAGS if flag in flags), cpu.variant_name(),
                   torch.get_num_threads(), process_allocator(), measure_read_bandwidth())
