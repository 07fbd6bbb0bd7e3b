"""One stat logger per sink, each fed the same engine stats: Prometheus metrics, OpenTelemetry spans, log lines."""
