"""The NVML and host collectors, against a test double of pynvml's functions (there is no GPU here)."""

from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from telemetry.hardware import HardwareSampler, HostCollector, NvmlCollector
from telemetry.metrics import VigilMetrics


class FakeNvml:
    """The pynvml functions Vigil calls, answering for two GPUs in pynvml's own units."""

    NVML_TEMPERATURE_GPU = 0
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksEventReasonGpuIdle = 0x1

    def __init__(self) -> None:
        self.reasons = [0x1, 0x20]

    def nvmlInit(self): ...
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return f"handle{i}"
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200" if h == "handle0" else "NVIDIA H100"
    def nvmlDeviceGetTemperature(self, h, sensor): return 61 if h == "handle0" else 88
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=80 * 2**30, total=141 * 2**30)
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=97, memory=40)
    def nvmlDeviceGetPowerUsage(self, h): return 512_250  # milliwatts
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self.reasons[int(h[-1])]


class FailingNvml:
    def nvmlInit(self):
        raise RuntimeError("NVML Shared Library Not Found")


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def test_gpu_readings_land_in_base_units():
    registry = CollectorRegistry()
    metrics = VigilMetrics("m", registry)
    HardwareSampler(metrics, 1.0, gpus=NvmlCollector(FakeNvml())).sample()
    first = {"gpu": "0", "name": "NVIDIA H200"}
    second = {"gpu": "1", "name": "NVIDIA H100"}
    assert value(registry, "vigil_gpu_count") == 2
    assert value(registry, "vigil_gpu_temperature_celsius", **first) == 61
    assert value(registry, "vigil_gpu_memory_used_bytes", **first) == 80 * 2**30
    assert value(registry, "vigil_gpu_memory_total_bytes", **first) == 141 * 2**30
    assert value(registry, "vigil_gpu_utilization_ratio", **first) == 0.97
    assert value(registry, "vigil_gpu_power_watts", **first) == 512.25
    assert value(registry, "vigil_gpu_throttled", **first) == 0  # idle is not throttling
    assert value(registry, "vigil_gpu_throttled", **second) == 1  # thermal slowdown is


def test_without_nvml_the_gpu_count_is_zero_and_nothing_raises(capsys):
    registry = CollectorRegistry()
    collector = NvmlCollector(FailingNvml())
    sampler = HardwareSampler(VigilMetrics("m", registry), 1.0, gpus=collector)
    sampler.sample()
    assert collector.gpu_count == 0 and collector.read() == []
    assert value(registry, "vigil_gpu_count") == 0
    assert value(registry, "vigil_host_memory_total_bytes") > 0


def test_the_real_pynvml_on_this_gpu_less_machine_reports_zero_gpus():
    assert NvmlCollector().gpu_count == 0


def test_host_collector_reads_proc(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    host = HostCollector(tmp_path)
    (tmp_path / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")
    assert host.cpu_utilization() == 0.5
    assert host.memory() == (600 * 1024, 1000 * 1024)


def test_the_sampler_thread_samples_on_its_interval_and_runs_tick_hooks():
    import threading

    ticked = threading.Event()
    sampler = HardwareSampler(
        VigilMetrics("m", CollectorRegistry()), 0.05, gpus=NvmlCollector(FakeNvml()), on_tick=[ticked.set]
    )
    sampler.start()
    try:
        assert ticked.wait(timeout=5)
    finally:
        sampler.stop()
