"""The stat loggers on the real engine, fed the same stats: metric values, GenAI spans and JSON log lines match
what ran."""

import io
import json
import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from server import SamplingParams
from server.engine.stats import FinishedRequestStats, StepStats
from telemetry.logging import configure_logging
from telemetry.metrics import VigilMetrics
from telemetry.stat_loggers.log_lines import LoggingStatLogger
from telemetry.stat_loggers.prometheus import PrometheusStatLogger
from telemetry.stat_loggers.spans import TracingStatLogger
from telemetry.tracing import RequestTracer, build_tracer_provider

pytestmark = pytest.mark.slow

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def recorded_run(llm_fp32):
    """Three requests with known parameters through the engine, with every sink attached."""
    registry = CollectorRegistry()
    metrics = VigilMetrics("smol", registry)
    exporter = InMemorySpanExporter()
    provider = build_tracer_provider("vigil-test", None, exporter=exporter)
    tracer = RequestTracer(provider)
    engine = llm_fp32.engine
    loggers = [
        PrometheusStatLogger(metrics, engine.eos_token_ids, trace_id_of=tracer.trace_id),
        LoggingStatLogger(engine.eos_token_ids, trace_id_of=tracer.trace_id, interval_s=0.0),
        TracingStatLogger(tracer),
    ]

    def record(stats):
        for logger in loggers:
            logger.record(stats)

    log_stream = io.StringIO()
    configure_logging("json")
    logging.getLogger().handlers[0].stream = log_stream
    engine.stats_listeners.append(record)
    requests = [
        ("a", "The capital of France is", SamplingParams(temperature=0.0, max_tokens=5)),
        ("b", "Once upon a time", SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=9, ignore_eos=True)),
        ("c", "1, 2, 3,", SamplingParams(temperature=1.3, top_p=0.5, seed=5, max_tokens=7, ignore_eos=True)),
    ]
    try:
        for request_id, prompt, params in requests:
            request = engine.make_request(request_id, prompt, params)
            headers = {"traceparent": TRACEPARENT} if request_id == "a" else {}
            tracer.start([request_id], "text_completion", "smol", params, request.max_tokens, headers)
            engine.add_request(request)
        outputs = {}
        while engine.has_unfinished_requests():
            for output in engine.step():
                outputs[output.request_id] = output
        for logger in loggers:
            logger.tick()
    finally:
        engine.stats_listeners.remove(record)
    provider.force_flush()
    logs = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    return registry, exporter.get_finished_spans(), logs, outputs, requests


def sample(registry, name, **labels):
    return registry.get_sample_value(name, {"model": "smol", **labels})


def test_counters_and_histograms_match_what_ran(recorded_run):
    registry, _, _, outputs, requests = recorded_run
    generated = sum(len(o.outputs[0].token_ids) for o in outputs.values())
    assert sample(registry, "vigil_generation_tokens_total") == generated
    assert sample(registry, "vigil_prompt_tokens_total") == sum(len(o.prompt_token_ids) for o in outputs.values())
    for histogram in ("vigil_time_to_first_token_seconds", "vigil_request_queue_time_seconds",
                      "vigil_request_duration_seconds", "vigil_request_prompt_tokens"):
        assert sample(registry, f"{histogram}_count") == len(requests), histogram
    temperatures = sorted(p.temperature for _, _, p in requests)
    assert sample(registry, "vigil_request_temperature_sum") == pytest.approx(sum(temperatures))
    assert sample(registry, "vigil_request_temperature_bucket", le="0.0") == 1
    assert sample(registry, "vigil_request_temperature_bucket", le="0.7") == 2
    assert sample(registry, "vigil_request_temperature_bucket", le="1.2") == 2
    assert sample(registry, "vigil_request_temperature_bucket", le="1.5") == 3
    assert sample(registry, "vigil_request_finished_total", finish_reason="length") == 3 - sum(
        o.outputs[0].finish_reason == "stop" for o in outputs.values()
    )
    assert sample(registry, "vigil_inter_token_latency_seconds_count") == generated - len(requests)
    assert sample(registry, "vigil_batch_size_bucket", le="2.0") < sample(registry, "vigil_batch_size_count")
    assert sample(registry, "vigil_kv_cache_blocks", state="used") == 0


def test_one_genai_span_per_request_with_events_and_usage(recorded_run):
    _, spans, _, outputs, requests = recorded_run
    assert sorted(s.name for s in spans) == ["text_completion smol"] * 3
    by_tokens = {s.attributes["gen_ai.usage.output_tokens"]: s for s in spans}
    for request_id, _, params in requests:
        output = outputs[request_id]
        span = by_tokens[len(output.outputs[0].token_ids)]
        attrs = span.attributes
        assert attrs["gen_ai.operation.name"] == "text_completion"
        assert attrs["gen_ai.request.model"] == "smol"
        assert attrs["gen_ai.request.temperature"] == params.temperature
        assert attrs["gen_ai.request.top_p"] == params.top_p
        assert attrs["gen_ai.request.max_tokens"] == params.max_tokens
        assert attrs.get("gen_ai.request.seed") == params.seed
        assert attrs["gen_ai.usage.input_tokens"] == len(output.prompt_token_ids)
        assert tuple(attrs["gen_ai.response.finish_reasons"]) == (output.outputs[0].finish_reason,)
        assert "gen_ai.usage.prompt_tokens" not in attrs
        events = [e.name for e in span.events]
        assert events[:3] == ["queued", "scheduled", "first_token"]
    traced = [s for s in spans if s.parent is not None]
    assert len(traced) == 1 and format(traced[0].context.trace_id, "032x") == TRACEPARENT.split("-")[1]


def test_one_json_log_line_per_request_without_prompt_or_output(recorded_run):
    _, spans, logs, _, requests = recorded_run
    finished = [line for line in logs if line["event"] == "request_finished"]
    assert sorted(line["request_id"] for line in finished) == [r[0] for r in requests]
    trace_ids = {format(s.context.trace_id, "032x") for s in spans}
    for line in finished:
        assert line["trace_id"] in trace_ids
        assert {"duration_s", "queue_s", "ttft_s", "prompt_tokens", "generation_tokens", "finish_reason"} <= set(line)
        assert "output" not in line and "prompt" not in line
    assert any(line["event"] == "engine_stats" for line in logs)


def finished(request_id: str, first_token_time: float | None, finish_reason: str) -> FinishedRequestStats:
    return FinishedRequestStats(
        request_id, finish_reason, None, arrival_time=100.0, queued_time=100.0, scheduled_time=100.5,
        first_token_time=first_token_time, last_token_time=first_token_time, finished_time=112.0,
        num_prompt_tokens=5, num_generation_tokens=0 if first_token_time is None else 1, num_cached_tokens=0,
        num_preemptions=0, max_tokens=16, sampling_params=SamplingParams(), output_token_ids=(),
    )


def quiet_step(**fields) -> StepStats:
    return StepStats(
        timestamp=112.0, step_duration_s=0.01, num_running=0, num_waiting=0, num_kv_blocks_used=0,
        num_kv_blocks_total=16, num_kv_slots_held=0, num_kv_slots_filled=0, num_scheduled_tokens=0,
        num_prefill_seqs=0, num_decode_seqs=0, num_preemptions=0, prefix_cache_queries=0, prefix_cache_hits=0,
        num_prompt_tokens=0, num_generation_tokens=0, model_flops=0, **fields,
    )


def test_a_request_given_up_on_before_its_first_token_counts_as_slow_as_its_wait():
    """It was not counted at all before: 12 s without a token is a TTFT of at least 12 s for the SLO. A request
    answered and then aborted was counted when its first token came, and is not counted again."""
    registry = CollectorRegistry()
    logger = PrometheusStatLogger(VigilMetrics("smol", registry))
    logger.record(quiet_step(time_to_first_token_s={"answered-then-aborted": 0.8}))
    assert sample(registry, "vigil_time_to_first_token_seconds_count") == 1
    logger.record(quiet_step(finished=[finished("gave-up", None, "abort"), finished("answered-then-aborted", 100.8,
                                                                                    "abort")]))
    assert sample(registry, "vigil_time_to_first_token_seconds_count") == 2
    assert sample(registry, "vigil_time_to_first_token_seconds_sum") == pytest.approx(12.0 + 0.8)
    assert sample(registry, "vigil_time_to_first_token_seconds_bucket", le="2.0") == 1


def test_ttft_is_counted_when_the_first_token_comes_not_when_the_request_ends(tiny_engine):
    """A stream whose first token was slow must show in the TTFT SLO while it is still streaming."""
    registry = CollectorRegistry()
    logger = PrometheusStatLogger(VigilMetrics("smol", registry))
    tiny_engine.stats_listeners.append(logger.record)
    try:
        request = tiny_engine.make_request("streaming-ttft", [1, 2, 3, 4], SamplingParams(max_tokens=40,
                                                                                          ignore_eos=True))
        tiny_engine.add_request(request)
        tiny_engine.step()
        tiny_engine.step()
        assert tiny_engine.has_unfinished_requests()
        assert sample(registry, "vigil_time_to_first_token_seconds_count") == 1
        assert sample(registry, "vigil_request_duration_seconds_count") in (None, 0.0)
        while tiny_engine.has_unfinished_requests():
            tiny_engine.step()
        assert sample(registry, "vigil_time_to_first_token_seconds_count") == 1
        assert sample(registry, "vigil_request_duration_seconds_count") == 1
    finally:
        tiny_engine.stats_listeners.remove(logger.record)
