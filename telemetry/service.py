"""Telemetry as a whole: builds the sinks, subscribes them to the engine, serves /metrics, shuts down."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from server.engine.engine import LLMEngine
from server.engine.request import INTERNAL_REQUEST_PREFIX
from server.engine.stats import StepStats
from telemetry.hardware import HardwareSampler
from telemetry.metrics import LATENCY_BUCKETS, VigilMetrics
from telemetry.stat_loggers.base import StatLogger
from telemetry.stat_loggers.log_lines import LoggingStatLogger
from telemetry.stat_loggers.prometheus import PrometheusStatLogger
from telemetry.stat_loggers.spans import TracingStatLogger
from telemetry.tracing import RequestTracer, build_tracer_provider


@dataclass(frozen=True)
class TelemetryConfig:
    model: str
    hardware_interval_s: float = 5.0
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    log_requests: bool = False
    latency_buckets: Sequence[float] = LATENCY_BUCKETS
    matmul_peak_flops: float | None = None


class Telemetry:
    """Owns the registry, the stat loggers, the tracer and the hardware sampler of one server."""

    def __init__(self, config: TelemetryConfig, engine: LLMEngine, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        if registry is None:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.metrics = VigilMetrics(config.model, self.registry, config.latency_buckets)
        cache = engine.cache_info
        self.metrics.kv_cache_memory.labels(config.model).set(cache.total_bytes)
        self.metrics.kv_cache_config.labels(
            config.model, str(cache.block_size), str(cache.num_blocks), cache.dtype, cache.device
        ).set(1)
        self.provider = build_tracer_provider("vigil", config.otlp_endpoint, config.otlp_protocol)
        self.tracer = RequestTracer(self.provider) if self.provider is not None else None
        trace_id_of = self.tracer.trace_id if self.tracer is not None else None
        self.stat_loggers: list[StatLogger] = [
            PrometheusStatLogger(self.metrics, engine.eos_token_ids, config.matmul_peak_flops, trace_id_of),
            LoggingStatLogger(
                engine.eos_token_ids, engine.tokenizer.decode if config.log_requests else None, trace_id_of
            ),
        ]
        if self.tracer is not None:
            self.stat_loggers.append(TracingStatLogger(self.tracer))  # last: it ends the spans the others read
        self.sampler = HardwareSampler(
            self.metrics, config.hardware_interval_s, on_tick=[logger.tick for logger in self.stat_loggers]
        )
        engine.stats_listeners.append(self.record)

    def record(self, stats: StepStats) -> None:
        """Feed one step to every stat logger; the server's own requests (readiness canaries) are left out."""
        if any(f.request_id.startswith(INTERNAL_REQUEST_PREFIX) for f in stats.finished):
            served = [f for f in stats.finished if not f.request_id.startswith(INTERNAL_REQUEST_PREFIX)]
            stats = replace(stats, finished=served)
        for logger in self.stat_loggers:
            logger.record(stats)

    def start(self) -> None:
        self.sampler.start()
        for hook in self.sampler.on_tick:
            hook()

    def shutdown(self) -> None:
        self.sampler.stop()
        if self.provider is not None:
            self.provider.shutdown()

    def set_ready(self, ready: bool) -> None:
        self.metrics.engine_ready.labels(self.metrics.model).set(1 if ready else 0)

    def watch_readiness(self, is_ready: Callable[[], bool]) -> None:
        """Keep ``vigil_engine_ready`` in step with ``is_ready``, sampled on the hardware interval."""
        self.sampler.on_tick.append(lambda: self.set_ready(is_ready()))
        self.set_ready(is_ready())

    def record_error(self, reason: str) -> None:
        self.metrics.request_errors.labels(reason).inc()

    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (OpenMetrics carries the exemplars)."""
        encoder, content_type = choose_encoder(accept_header or "")
        return encoder(self.registry), content_type
