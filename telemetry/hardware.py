"""Infrastructure sampling: GPUs through NVML and the host through /proc, on a background thread.

Sampling happens every ``interval_s`` on the sampler thread, never at scrape time. Each reading (one NVML
field of one GPU, or one host figure) is taken on its own: one that fails is counted in
``vigil_hardware_sample_errors_total{field}`` and its series are removed, while every other reading still
updates. ``vigil_hardware_last_success_timestamp_seconds`` moves only when a whole sample succeeded.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import structlog
from prometheus_client import Gauge

from telemetry.metrics import VigilMetrics

log = structlog.get_logger("vigil.hardware")


@dataclass(frozen=True)
class GpuReading:
    """One GPU's figures; a figure NVML could not give is None, and ``failed`` names the fields that erred."""

    index: int
    name: str
    temperature_celsius: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_ratio: float | None = None
    power_watts: float | None = None
    throttled: bool | None = None
    failed: tuple[str, ...] = ()


def _throttle_mask(nvml: ModuleType) -> int:
    """Heat and the hardware power brake: the software power cap holds clocks back under every full load, which
    is where an inference server should be."""
    names = (
        "nvmlClocksEventReasonSwThermalSlowdown", "nvmlClocksEventReasonHwThermalSlowdown",
        "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    )
    mask = 0
    for name in names:
        mask |= getattr(nvml, name, 0)
    return mask


def _temperature(nvml: ModuleType, handle: object) -> dict:
    return {"temperature_celsius": float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))}


def _memory(nvml: ModuleType, handle: object) -> dict:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return {"memory_used_bytes": int(memory.used), "memory_total_bytes": int(memory.total)}


def _utilization(nvml: ModuleType, handle: object) -> dict:
    return {"utilization_ratio": nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0}


def _power(nvml: ModuleType, handle: object) -> dict:
    return {"power_watts": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}


def _throttle(nvml: ModuleType, handle: object) -> dict:
    return {"throttled": bool(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) & _throttle_mask(nvml))}


# The `field` label of vigil_hardware_sample_errors_total -> how that field is read from one GPU.
GPU_FIELDS: dict[str, Callable[[ModuleType, object], dict]] = {
    "temperature": _temperature, "memory": _memory, "utilization": _utilization, "power": _power,
    "throttle": _throttle,
}


class FailureLog:
    """Runs one reading at a time; logs a reading when it starts failing and when it recovers, not every time."""

    def __init__(self) -> None:
        self._failing: set[str] = set()

    def attempt(self, key: str, read: Callable[[], dict], absent: Callable[[Exception], bool]) -> dict | None:
        """``read()``'s values; {} when ``absent(error)`` says the figure does not exist; None when it failed."""
        try:
            values = read()
        except Exception as error:  # noqa: BLE001 - any failure of one reading is that reading's alone
            if absent(error):
                return {}
            if key not in self._failing:
                log.warning("hardware_read_failed", reading=key, error=str(error) or type(error).__name__)
                self._failing.add(key)
            return None
        if key in self._failing:
            log.info("hardware_read_recovered", reading=key)
            self._failing.discard(key)
        return values


def _never_absent(error: Exception) -> bool:
    return False


class NvmlCollector:
    """Reads every GPU through pynvml. Without NVML (no driver, no GPU) it watches no GPU and never fails."""

    def __init__(self) -> None:
        self.nvml: ModuleType | None = None
        self.gpu_count = 0
        self._devices: dict[int, dict] = {}
        self._failures = FailureLog()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.gpu_count = pynvml.nvmlDeviceGetCount()
            self.nvml = pynvml
        except Exception as error:  # noqa: BLE001 - any NVML failure at start means "no GPUs to watch"
            log.info("nvml_unavailable", reason=str(error) or type(error).__name__)
            self.gpu_count = 0

    def read(self) -> list[GpuReading]:
        return [self._read_gpu(index) for index in range(self.gpu_count)]

    def _device(self, index: int) -> dict:
        """The GPU's handle and name, kept once NVML has given them."""
        if index not in self._devices:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            name = self.nvml.nvmlDeviceGetName(handle)
            self._devices[index] = {"handle": handle, "name": name.decode() if isinstance(name, bytes) else name}
        return self._devices[index]

    def _not_supported(self, error: Exception) -> bool:
        """NVML has no such figure on this GPU (power on some boards, utilisation under MIG): not a failure."""
        return isinstance(error, self.nvml.NVMLError) and error.value == self.nvml.NVML_ERROR_NOT_SUPPORTED

    def _read_gpu(self, index: int) -> GpuReading:
        device = self._failures.attempt(f"gpu{index}.device", lambda: self._device(index), _never_absent)
        if not device:
            return GpuReading(index, name="", failed=("device",))
        values, failed = {}, []
        for field, read in GPU_FIELDS.items():
            found = self._failures.attempt(
                f"gpu{index}.{field}", lambda read=read: read(self.nvml, device["handle"]), self._not_supported
            )
            if found is None:
                failed.append(field)
            else:
                values.update(found)
        return GpuReading(index, device["name"], **values, failed=tuple(failed))


class HostCollector:
    """CPU busy share from /proc/stat deltas; memory used as MemTotal - MemAvailable."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._last_cpu = self._cpu_times()

    def _cpu_times(self) -> tuple[int, int]:
        fields = [int(v) for v in (self.proc / "stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    def cpu_utilization(self) -> float:
        total, idle = self._cpu_times()
        last_total, last_idle = self._last_cpu
        self._last_cpu = (total, idle)
        elapsed = total - last_total
        return 0.0 if elapsed <= 0 else 1.0 - (idle - last_idle) / elapsed

    def memory(self) -> tuple[int, int]:
        """(used, total) in bytes."""
        info = {}
        for line in (self.proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
        return info["MemTotal"] - info["MemAvailable"], info["MemTotal"]


class HardwareSampler:
    """Writes GPU and host readings into the metrics every ``interval_s``, and runs ``on_tick`` hooks."""

    def __init__(
        self,
        metrics: VigilMetrics,
        interval_s: float,
        gpus: NvmlCollector | None = None,
        host: HostCollector | None = None,
        on_tick: list[Callable[[], None]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.gpus = gpus if gpus is not None else NvmlCollector()
        self.host = host if host is not None else HostCollector()
        self.on_tick = on_tick or []
        self._gpu_gauges: dict[str, Gauge] = {
            "temperature_celsius": metrics.gpu_temperature,
            "memory_used_bytes": metrics.gpu_memory_used,
            "memory_total_bytes": metrics.gpu_memory_total,
            "utilization_ratio": metrics.gpu_utilization,
            "power_watts": metrics.gpu_power,
            "throttled": metrics.gpu_throttled,
        }
        self._written: set[tuple[str, tuple[str, str]]] = set()
        self._host_failures = FailureLog()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vigil-hardware", daemon=True)
        metrics.gpu_count.set(self.gpus.gpu_count)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def sample(self) -> None:
        failed = self._sample_gpus() + self._sample_host()
        for field in failed:
            self.metrics.hardware_sample_errors.labels(field).inc()
        if not failed:
            self.metrics.hardware_last_success.set(time.time())

    def _sample_gpus(self) -> list[str]:
        """Sets every GPU figure read; removes the series of those not read, so that none stays frozen."""
        failed: list[str] = []
        written: set[tuple[str, tuple[str, str]]] = set()
        for reading in self.gpus.read():
            failed.extend(reading.failed)
            labels = (str(reading.index), reading.name)
            for attribute, gauge in self._gpu_gauges.items():
                value = getattr(reading, attribute)
                if value is not None:
                    gauge.labels(*labels).set(float(value))
                    written.add((attribute, labels))
        for attribute, labels in self._written - written:
            self._gpu_gauges[attribute].remove(*labels)
        self._written = written
        return failed

    def _sample_host(self) -> list[str]:
        m = self.metrics
        memory_gauges = (m.host_memory_used, m.host_memory_total)
        readings = {
            "host_cpu": lambda: {m.host_cpu: self.host.cpu_utilization()},
            "host_memory": lambda: dict(zip(memory_gauges, self.host.memory(), strict=True)),
        }
        failed = []
        for field, read in readings.items():
            values = self._host_failures.attempt(field, read, _never_absent)
            if values is None:
                failed.append(field)
                continue
            for gauge, value in values.items():
                gauge.set(value)
        return failed

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()
            for hook in self.on_tick:
                try:
                    hook()
                except Exception:  # noqa: BLE001 - a failing hook must not end sampling
                    log.exception("hardware_tick_hook_failed")
