"""One OpenTelemetry span per request, with GenAI semantic-convention attributes and lifecycle events."""

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from server.engine.request import SamplingParams
from server.engine.stats import FinishedRequestStats

_PROPAGATOR = TraceContextTextMapPropagator()


def monotonic_to_epoch_ns(monotonic_s: float) -> int:
    """Stats carry monotonic timestamps; spans want wall-clock nanoseconds."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def build_tracer_provider(
    service_name: str, endpoint: str | None, protocol: str = "grpc", exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """A provider exporting through a background batch processor, or None when tracing is off.

    Tracing is on when an exporter is given, ``--otlp-endpoint`` is set, or the standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variables are.
    """
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter is None and not (endpoint or env_endpoint):
        return None
    if exporter is None:
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        if protocol.startswith("http"):
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

            url = endpoint.rstrip("/") + "/v1/traces" if endpoint else None
            exporter = HttpExporter(endpoint=url)
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

            exporter = GrpcExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


@dataclass
class _SpanState:
    span: Span
    pending_choices: int
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)


class RequestTracer:
    """Spans keyed by engine request id. ``start`` runs on the API side; events and ``finish`` on the engine
    thread, so the registry is locked. All choices of an ``n > 1`` request share one span."""

    def __init__(self, provider: TracerProvider) -> None:
        self._tracer = provider.get_tracer("vigil")
        self._spans: dict[str, _SpanState] = {}
        self._lock = threading.Lock()

    def start(
        self,
        request_ids: list[str],
        operation: str,
        model: str,
        params: SamplingParams,
        max_tokens: int,
        headers: Mapping[str, str],
        tenant: str | None = None,
    ) -> str:
        """Open the span (a child of the caller's ``traceparent``, if any); returns its trace id in hex."""
        span = self._tracer.start_span(
            f"{operation} {model}", context=_PROPAGATOR.extract(dict(headers)), kind=SpanKind.SERVER
        )
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "vigil",
            "gen_ai.request.model": model,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.max_tokens": max_tokens,
        }
        if params.top_k > 0:
            attributes["gen_ai.request.top_k"] = params.top_k
        if params.seed is not None:
            attributes["gen_ai.request.seed"] = params.seed
        if len(request_ids) > 1:
            attributes["gen_ai.request.choice.count"] = len(request_ids)
        if tenant is not None:
            attributes["vigil.tenant"] = tenant
        span.set_attributes(attributes)
        state = _SpanState(span, pending_choices=len(request_ids))
        with self._lock:
            for request_id in request_ids:
                self._spans[request_id] = state
        return format_trace_id(span.get_span_context().trace_id)

    def trace_id(self, request_id: str) -> str | None:
        with self._lock:
            state = self._spans.get(request_id)
        return format_trace_id(state.span.get_span_context().trace_id) if state else None

    def event(self, request_id: str, kind: str, monotonic_s: float) -> None:
        with self._lock:
            state = self._spans.get(request_id)
        if state is not None:
            state.span.add_event(kind, {"vigil.request_id": request_id}, monotonic_to_epoch_ns(monotonic_s))

    def finish(self, stats: FinishedRequestStats) -> None:
        with self._lock:
            state = self._spans.pop(stats.request_id, None)
            if state is None:
                return
            state.pending_choices -= 1
            state.input_tokens = stats.num_prompt_tokens
            state.output_tokens += stats.num_generation_tokens
            state.finish_reasons.append(stats.finish_reason)
            if state.pending_choices:
                return
        state.span.set_attributes({
            "gen_ai.response.finish_reasons": state.finish_reasons,
            "gen_ai.usage.input_tokens": state.input_tokens,
            "gen_ai.usage.output_tokens": state.output_tokens,
        })
        state.span.end(monotonic_to_epoch_ns(stats.finished_time))

    def discard(self, request_ids: list[str], error: str) -> None:
        """End the span of a request that never reached the engine, marking it as failed."""
        with self._lock:
            states = {id(s): s for r in request_ids if (s := self._spans.pop(r, None)) is not None}
        for state in states.values():
            state.span.set_attribute("error.type", error)
            state.span.set_status(trace.Status(trace.StatusCode.ERROR, error))
            state.span.end()
