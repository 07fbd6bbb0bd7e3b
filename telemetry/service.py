"""Telemetry as a whole: builds the sinks, subscribes them to the engine, serves /metrics, shuts down."""

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from server.engine.engine import LLMEngine
from server.engine.stats import StepStats
from telemetry.console import Console, ConsoleConfig
from telemetry.hardware import HardwareSampler
from telemetry.metrics import ENGINE_PHASES, LATENCY_BUCKETS, VigilMetrics
from telemetry.stat_loggers.base import StatLogger
from telemetry.stat_loggers.log_lines import LoggingStatLogger
from telemetry.stat_loggers.prometheus import PrometheusStatLogger
from telemetry.stat_loggers.spans import TracingStatLogger
from telemetry.tracing import RequestTracer, build_tracer_provider


@dataclass(frozen=True)
class TelemetryConfig:
    model: str  # the first served model; the others, in a server with several, in other_models
    other_models: tuple[str, ...] = ()
    hardware_interval_s: float = 5.0
    otlp_endpoint: str | None = None
    otlp_protocol: str = "grpc"
    log_requests: bool = False
    latency_buckets: Sequence[float] = LATENCY_BUCKETS
    console: ConsoleConfig | None = ConsoleConfig()  # None: no live console (--disable-console)


class Telemetry:
    """Owns the registry, the stat loggers, the tracer and the hardware sampler of one server, whatever the number
    of models it serves: one registry, each model's series under its own ``model`` label.

    It exists before the engines do, so that /metrics answers while the models load; ``attach`` subscribes it
    to each engine once that is built."""

    def __init__(self, config: TelemetryConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        if registry is None:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.metrics = VigilMetrics(config.model, self.registry, config.latency_buckets)
        self.provider = build_tracer_provider("vigil", config.otlp_endpoint, config.otlp_protocol)
        self.tracer = RequestTracer(self.provider) if self.provider is not None else None
        self.stat_loggers: list[StatLogger] = []
        self.sampler = HardwareSampler(self.metrics, config.hardware_interval_s)
        self.console = None if config.console is None else Console(
            self.metrics, self.sampler.gpus.gpu_count, config.console)
        for model in config.other_models:
            self.metrics.add_model(model)
        for model in (config.model, *config.other_models):
            self.report_status("loading", ready=False, model=model)

    def attach(self, engine: LLMEngine, matmul_peak_flops: float | None = None, model: str | None = None) -> None:
        """Describe the built engine of ``model`` (by default the first) in metrics and subscribe stat loggers to
        its steps. Call it before the engine's first step."""
        model = self.config.model if model is None else model
        cache, info = engine.cache_info, engine.info
        self.metrics.kv_cache_memory.labels(model).set(cache.total_bytes)
        self.metrics.kv_cache_config.labels(
            model, str(cache.block_size), str(cache.num_blocks), cache.dtype, cache.device
        ).set(1)
        self.metrics.engine_config.labels(
            model, info.attention_backend, info.dtype, info.weight_dtype, info.quantization, info.device,
            str(info.tensor_parallel_size), info.cpu_kernels, info.decode_path, info.linear_kernels, info.allocator,
        ).set(1)
        self.metrics.model_weight_bytes.labels(model).set(info.weight_bytes)
        trace_id_of = self.tracer.trace_id if self.tracer is not None else None
        decode_tokens = engine.tokenizer.decode if self.config.log_requests else None
        loggers: list[StatLogger] = [
            PrometheusStatLogger(self.metrics, engine.eos_token_ids, matmul_peak_flops, trace_id_of, model),
            LoggingStatLogger(engine.eos_token_ids, decode_tokens, trace_id_of),
        ]
        if self.console is not None:
            loggers.append(self.console.logger(model, engine, trace_id_of, decode_tokens))
        if self.tracer is not None:
            loggers.append(TracingStatLogger(self.tracer))  # last: it ends the spans the others read
        self.stat_loggers += loggers
        self.sampler.on_tick += [logger.tick for logger in loggers]
        engine.stats_listeners.append(lambda stats: self.record(stats, loggers))

    def record(self, stats: StepStats, loggers: Sequence[StatLogger] | None = None) -> None:
        """Feed one step to every stat logger of its engine (by default, of every engine)."""
        for logger in self.stat_loggers if loggers is None else loggers:
            logger.record(stats)

    def start(self) -> None:
        self.sampler.start()
        if self.console is not None:
            self.console.start()
        for hook in self.sampler.on_tick:
            hook()

    def shutdown(self) -> None:
        self.sampler.stop()
        if self.console is not None:
            self.console.stop()
        if self.provider is not None:
            self.provider.shutdown()

    def report_status(self, phase: str, ready: bool, model: str | None = None) -> None:
        """``vigil_engine_phase`` and ``vigil_engine_ready`` of ``model`` (by default the first): ``phase`` is one of
        ENGINE_PHASES."""
        model = self.config.model if model is None else model
        for name in ENGINE_PHASES:
            self.metrics.engine_phase.labels(model, name).set(1 if name == phase else 0)
        self.metrics.engine_ready.labels(model).set(1 if ready else 0)

    def record_error(self, reason: str) -> None:
        self.metrics.request_errors.labels(reason).inc()

    def record_route(self, alias: str, model: str, reason: str) -> None:
        self.metrics.router_decisions.labels(alias, model, reason).inc()

    def exposition(self, accept_header: str | None) -> tuple[bytes, str]:
        """The registry in the format the scraper asked for (OpenMetrics carries the exemplars)."""
        encoder, content_type = choose_encoder(accept_header or "")
        return encoder(self.registry), content_type
