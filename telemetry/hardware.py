"""Infrastructure sampling: GPUs through NVML and the host through /proc, on a background thread.

Sampling happens every ``interval_s`` on the sampler thread, never at scrape time.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import structlog

from telemetry.metrics import VigilMetrics

log = structlog.get_logger("vigil.hardware")


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    temperature_celsius: float
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_ratio: float
    power_watts: float
    throttled: bool


def _throttle_mask(nvml: ModuleType) -> int:
    names = (
        "nvmlClocksEventReasonSwThermalSlowdown", "nvmlClocksEventReasonHwThermalSlowdown",
        "nvmlClocksEventReasonSwPowerCap", "nvmlClocksEventReasonHwPowerBrakeSlowdown",
    )
    mask = 0
    for name in names:
        mask |= getattr(nvml, name, 0)
    return mask


class NvmlCollector:
    """Reads every GPU through pynvml's functions (``nvml`` is the module, or a test double of it)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml
        self.handles: list[object] = []
        self.names: list[str] = []
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(self.nvml.nvmlDeviceGetName(h)) for h in self.handles]
        except Exception as error:  # noqa: BLE001 - any NVML failure means "no GPUs to watch"
            log.info("nvml_unavailable", reason=str(error) or type(error).__name__)
            self.handles = []

    @property
    def gpu_count(self) -> int:
        return len(self.handles)

    def read(self) -> list[GpuReading]:
        nvml = self.nvml
        readings = []
        for index, (handle, name) in enumerate(zip(self.handles, self.names, strict=True)):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
            readings.append(GpuReading(
                index=index,
                name=name,
                temperature_celsius=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                utilization_ratio=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                power_watts=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                throttled=bool(reasons & _throttle_mask(nvml)),
            ))
        return readings


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
        m = self.metrics
        for reading in self.gpus.read():
            labels = (str(reading.index), reading.name)
            m.gpu_temperature.labels(*labels).set(reading.temperature_celsius)
            m.gpu_memory_used.labels(*labels).set(reading.memory_used_bytes)
            m.gpu_memory_total.labels(*labels).set(reading.memory_total_bytes)
            m.gpu_utilization.labels(*labels).set(reading.utilization_ratio)
            m.gpu_power.labels(*labels).set(reading.power_watts)
            m.gpu_throttled.labels(*labels).set(1 if reading.throttled else 0)
        m.host_cpu.set(self.host.cpu_utilization())
        used, total = self.host.memory()
        m.host_memory_used.set(used)
        m.host_memory_total.set(total)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
                for hook in self.on_tick:
                    hook()
            except Exception:  # noqa: BLE001 - a failed sample must not end sampling
                log.exception("hardware_sample_failed")
