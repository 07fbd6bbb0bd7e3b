"""The NVML and host collectors. There is no GPU here, so a fake ``pynvml`` module, which can be told to fail
any call for any GPU, stands in for the real one in ``sys.modules``; the product code imports it as usual."""

import sys
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from telemetry.hardware import HardwareSampler, HostCollector, NvmlCollector
from telemetry.metrics import HARDWARE_FIELDS, VigilMetrics

H200 = {"gpu": "0", "name": "NVIDIA H200"}
H100 = {"gpu": "1", "name": "NVIDIA H100"}
GPU_SERIES = (
    "vigil_gpu_temperature_celsius", "vigil_gpu_memory_used_bytes", "vigil_gpu_memory_total_bytes",
    "vigil_gpu_utilization_ratio", "vigil_gpu_power_watts", "vigil_gpu_throttled",
)


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakePynvml(ModuleType):
    """pynvml's functions for two GPUs, in pynvml's units. ``failing[(function, gpu)]`` makes that call raise
    that NVML error code (gpu None: for every GPU); ``temperature`` sets what the sensors read."""

    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    NVMLError = NVMLError
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80

    def __init__(self, gpus: int = 2) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.failing: dict[tuple[str, int | None], int] = {}
        self.temperature = [61, 88]

    def _call(self, function: str, gpu: int | None = None) -> None:
        for key in ((function, gpu), (function, None)):
            if key in self.failing:
                raise NVMLError(self.failing[key])

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlDeviceGetCount(self):
        self._call("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i):
        self._call("nvmlDeviceGetHandleByIndex", i)
        return SimpleNamespace(index=i)

    def nvmlDeviceGetName(self, h):
        self._call("nvmlDeviceGetName", h.index)
        return b"NVIDIA H200" if h.index == 0 else "NVIDIA H100"

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        self._call("nvmlDeviceGetTemperature", h.index)
        return self.temperature[h.index]

    def nvmlDeviceGetMemoryInfo(self, h):
        self._call("nvmlDeviceGetMemoryInfo", h.index)
        return SimpleNamespace(used=80 * 2**30, total=141 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        self._call("nvmlDeviceGetUtilizationRates", h.index)
        return SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h):
        self._call("nvmlDeviceGetPowerUsage", h.index)
        return 512_250  # milliwatts

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksEventReasons", h.index)
        return [self.nvmlClocksEventReasonSwPowerCap, self.nvmlClocksEventReasonSwThermalSlowdown][h.index]


@pytest.fixture
def nvml(monkeypatch) -> FakePynvml:
    fake = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def sampler(nvml, registry) -> HardwareSampler:
    return HardwareSampler(VigilMetrics("m", registry), 1.0)


def value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def errors(registry: CollectorRegistry) -> dict[str, float]:
    return {field: value(registry, "vigil_hardware_sample_errors_total", field=field) for field in HARDWARE_FIELDS}


def gpu_series(registry: CollectorRegistry, gpu: dict[str, str]) -> dict[str, float | None]:
    return {name: value(registry, name, **gpu) for name in GPU_SERIES}


def test_gpu_readings_land_in_base_units(sampler, registry):
    before = time.time()
    sampler.sample()
    assert value(registry, "vigil_gpu_count") == 2
    assert gpu_series(registry, H200) == {
        "vigil_gpu_temperature_celsius": 61,
        "vigil_gpu_memory_used_bytes": 80 * 2**30,
        "vigil_gpu_memory_total_bytes": 141 * 2**30,
        "vigil_gpu_utilization_ratio": 0.97,
        "vigil_gpu_power_watts": 512.25,
        "vigil_gpu_throttled": 0,  # 97% busy at the power cap: full load, not throttling
    }
    assert value(registry, "vigil_gpu_throttled", **H100) == 1  # thermal slowdown is
    assert set(errors(registry).values()) == {0}
    assert before <= value(registry, "vigil_hardware_last_success_timestamp_seconds") <= time.time()


def test_a_failing_field_is_counted_and_its_series_removed_while_the_rest_keeps_updating(sampler, registry, nvml):
    sampler.sample()
    first_success = value(registry, "vigil_hardware_last_success_timestamp_seconds")
    nvml.failing[("nvmlDeviceGetTemperature", 1)] = nvml.NVML_ERROR_UNKNOWN
    nvml.temperature = [70, 99]
    sampler.sample()
    sampler.sample()

    assert errors(registry) == {field: (2 if field == "temperature" else 0) for field in HARDWARE_FIELDS}
    assert value(registry, "vigil_gpu_temperature_celsius", **H100) is None  # removed, not frozen at 88
    assert value(registry, "vigil_gpu_temperature_celsius", **H200) == 70  # still updating
    assert value(registry, "vigil_gpu_power_watts", **H100) == 512.25
    assert value(registry, "vigil_hardware_last_success_timestamp_seconds") == first_success

    del nvml.failing[("nvmlDeviceGetTemperature", 1)]
    sampler.sample()
    assert value(registry, "vigil_gpu_temperature_celsius", **H100) == 99
    assert value(registry, "vigil_hardware_last_success_timestamp_seconds") > first_success


def test_a_lost_gpu_loses_all_its_series_and_the_other_gpu_keeps_them(sampler, registry, nvml):
    sampler.sample()
    for function in ("Temperature", "MemoryInfo", "UtilizationRates", "PowerUsage", "CurrentClocksEventReasons"):
        nvml.failing[(f"nvmlDeviceGet{function}", 0)] = nvml.NVML_ERROR_GPU_IS_LOST
    sampler.sample()
    assert set(gpu_series(registry, H200).values()) == {None}
    assert None not in gpu_series(registry, H100).values()
    assert errors(registry) == {field: (0 if field in ("device", "host_cpu", "host_memory") else 1)
                                for field in HARDWARE_FIELDS}  # fmt: skip


def test_a_gpu_whose_handle_fails_is_counted_as_a_device_error_until_it_answers(registry, nvml):
    nvml.failing[("nvmlDeviceGetHandleByIndex", 1)] = nvml.NVML_ERROR_UNKNOWN
    sampler = HardwareSampler(VigilMetrics("m", registry), 1.0)
    sampler.sample()
    assert value(registry, "vigil_gpu_count") == 2
    assert errors(registry)["device"] == 1
    assert None not in gpu_series(registry, H200).values()
    assert set(gpu_series(registry, H100).values()) == {None}

    del nvml.failing[("nvmlDeviceGetHandleByIndex", 1)]
    sampler.sample()
    assert None not in gpu_series(registry, H100).values()
    assert errors(registry)["device"] == 1


def test_a_figure_the_gpu_does_not_support_is_absent_but_not_an_error(sampler, registry, nvml):
    nvml.failing[("nvmlDeviceGetPowerUsage", None)] = nvml.NVML_ERROR_NOT_SUPPORTED
    sampler.sample()
    assert value(registry, "vigil_gpu_power_watts", **H200) is None
    assert value(registry, "vigil_gpu_temperature_celsius", **H200) == 61
    assert set(errors(registry).values()) == {0}
    assert value(registry, "vigil_hardware_last_success_timestamp_seconds") > 0


def test_a_failing_host_reading_is_counted_and_the_gpus_still_update(registry, nvml, tmp_path):
    (tmp_path / "stat").write_text("cpu 1 0 1 8 0\n")  # and no meminfo
    sampler = HardwareSampler(VigilMetrics("m", registry), 1.0, host=HostCollector(tmp_path))
    sampler.sample()
    assert errors(registry)["host_memory"] == 1 and errors(registry)["host_cpu"] == 0
    assert value(registry, "vigil_gpu_temperature_celsius", **H100) == 88
    assert value(registry, "vigil_hardware_last_success_timestamp_seconds") == 0


@pytest.mark.parametrize(
    "broken",
    [{("nvmlInit", None): 999}, {("nvmlDeviceGetCount", None): 999}, "no module"],
    ids=["init-fails", "count-fails", "not-installed"],
)
def test_a_broken_nvml_never_stops_the_sampler_from_starting(registry, nvml, monkeypatch, broken):
    if broken == "no module":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    else:
        nvml.failing.update(broken)
    sampler = HardwareSampler(VigilMetrics("m", registry), 60.0)
    sampler.start()
    try:
        assert sampler.gpus.gpu_count == 0 and sampler.gpus.read() == []
        assert value(registry, "vigil_gpu_count") == 0
        assert value(registry, "vigil_host_memory_total_bytes") > 0
        assert value(registry, "vigil_hardware_last_success_timestamp_seconds") > 0
    finally:
        sampler.stop()


def test_the_real_pynvml_on_this_gpu_less_machine_reports_zero_gpus():
    assert NvmlCollector().gpu_count == 0


def test_host_collector_reads_proc(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    host = HostCollector(tmp_path)
    (tmp_path / "stat").write_text("cpu  150 0 150 900 0 0 0 0 0 0\n")
    assert host.cpu_utilization() == 0.5
    assert host.memory() == (600 * 1024, 1000 * 1024)


def test_the_sampler_thread_samples_on_its_interval_and_runs_tick_hooks(nvml, registry):
    ticked = threading.Event()
    sampler = HardwareSampler(VigilMetrics("m", registry), 0.05, on_tick=[ticked.set])
    sampler.start()
    try:
        assert ticked.wait(timeout=5)
    finally:
        sampler.stop()
