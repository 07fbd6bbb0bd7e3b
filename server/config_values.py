"""Values the configuration layer checks flags against, kept below it: the rooms above (server/api, telemetry)
import them from here, so that the flags and config modules need import nothing above themselves."""

# The names --tool-call-parser accepts; server/api/tool_parsers maps each to its parser (a test keeps both in step).
TOOL_PARSER_NAMES = ("hermes",)

# The latency histograms' default bucket upper bounds, in seconds (--latency-buckets).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)
# The latency SLOs' thresholds (alerts/slo.yml): each must be a bucket boundary, or the SLO's recording rules and
# burn-rate pages see no slow request. tests/test_slo.py keeps the two in step.
SLO_LATENCY_THRESHOLDS_S = (0.5, 2.0)
