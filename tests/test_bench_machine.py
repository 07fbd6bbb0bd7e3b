"""The bench's description of the machine: the CPU and ISA from /proc/cpuinfo, the allocator, and a measured read
bandwidth."""

from pathlib import Path

from kernels.cpu_variants import chosen_variant
from kernels.isa import cpu_flags, cpu_model
from server.allocator import process_allocator
from server.bench.machine import ISA_FLAGS, this_machine


def test_the_machine_is_named_with_the_isa_that_matters_and_a_measured_bandwidth():
    cpuinfo = Path("/proc/cpuinfo").read_text()
    machine = this_machine()
    assert machine.cpu in cpuinfo
    flags = set(next(line for line in cpuinfo.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    assert set(machine.isa) == flags & set(ISA_FLAGS)
    # Anything from a laptop's DRAM to a server's: a probe that cached its buffer or stalled would fall outside.
    assert 1e9 < machine.read_bandwidth_bytes_per_second < 1e12
    assert machine.cpu in machine.describe() and "GB/s" in machine.describe()
    # The best variant this CPU runs, unless VIGIL_CPU_ISA forces another.
    assert f"CPU kernels {chosen_variant().name}, allocator {process_allocator()}," in machine.describe()


def test_cpu_model_and_flags_read_the_first_processor():
    first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    assert cpu_model() in first
    assert "sse2" in cpu_flags() and all(flag in first for flag in cpu_flags())
