"""Engine stats onto OpenTelemetry spans: lifecycle events, and the usage and end of each request's span."""

from server.engine.stats import StepStats
from telemetry.stat_loggers.base import StatLogger
from telemetry.tracing import RequestTracer


class TracingStatLogger(StatLogger):
    """Ends spans, so it must be fed after the sinks that read trace ids."""

    def __init__(self, tracer: RequestTracer) -> None:
        self.tracer = tracer

    def record(self, stats: StepStats) -> None:
        for event in stats.events:
            self.tracer.event(event.request_id, event.kind, event.timestamp)
        for finished in stats.finished:
            self.tracer.finish(finished)
