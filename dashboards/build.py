"""Writes Vigil's Grafana dashboards (dashboards/*.json) from the descriptions below and in slo_dashboard.py.

    python dashboards/build.py           rewrite the JSON files
    python dashboards/build.py --check   exit 1 if a committed file differs from what this would write

Every panel reads the Prometheus picked by the `datasource` variable, and every query of the per-instance
dashboards is filtered by the `model` and `instance` variables (by instance alone for metrics without a model
label), so the same dashboards work on any Grafana. The SLO targets come from alerts/slo.yml, as the alert
rules' do. A test keeps the committed JSON equal to this script's output.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from alerts.slo import SLO, load  # noqa: E402
from dashboards.fleet_dashboard import fleet_dashboard  # noqa: E402
from dashboards.panels import (  # noqa: E402
    API_ROUTES,
    TOKENS_PER_SECOND,
    dashboard,
    heatmap,
    quantile,
    quantile_targets,
    rate,
    row,
    series,
    stat,
    target,
    thresholds,
    timeseries,
)
from dashboards.slo_dashboard import slo_dashboard  # noqa: E402

SLOS = {slo.name: slo for slo in load()}
# A target for the dashboards only (no SLO, no alert): how fast a user sees text stream.
OUTPUT_SPEED_P50_TARGET = 10  # tokens per second per request


def percentile(slo: SLO) -> str:
    """The quantile a latency SLO pins, as a tile names it: 0.99 -> "P99"."""
    return f"P{slo.objective * 100:g}"


def latency_slo_text(slo: SLO) -> str:
    return f"SLO: {percentile(slo)} ≤ {slo.threshold_seconds:g} s."


def overview() -> dict:
    api = series("vigil_http_requests_total", API_ROUTES)
    api_5xx = series("vigil_http_requests_total", API_ROUTES, 'code=~"5.."')
    ttft, availability = SLOS["time_to_first_token"], SLOS["availability"]
    scope = 'instance=~"$instance"'
    # Guarded by `> 0`: with no API traffic in the range the tile has no value ("no traffic"), not 0/0.
    success = (
        f"1 - ({availability.bad_rate('$__range', scope)})\n/ ({availability.total_rate('$__range', scope)} > 0)"
    )
    return dashboard(
        "vigil-overview",
        "Overview",
        "Golden signals and SLOs of the served models.",
        [
            row("Service level objectives, over the dashboard's time range"),
            stat(
                f"TTFT {percentile(ttft)} (SLO ≤ {ttft.threshold_seconds:g} s)",
                f"{percentile(ttft)} time to first token over the selected range. Red: the SLO is missed.",
                quantile(ttft.objective, "vigil_time_to_first_token_seconds", by="", window="$__range"),
                "s",
                thresholds("green", ttft.threshold_seconds * 0.75, "yellow", ttft.threshold_seconds, "red"),
            ),
            stat(
                f"Output speed P50 (target ≥ {OUTPUT_SPEED_P50_TARGET} tok/s)",
                "Median per-request decode speed over the selected range: how fast a user sees text stream.",
                quantile(0.5, "vigil_request_decode_speed_tokens_per_second", by="", window="$__range"),
                TOKENS_PER_SECOND,
                thresholds("red", OUTPUT_SPEED_P50_TARGET, "yellow", OUTPUT_SPEED_P50_TARGET * 1.5, "green"),
            ),
            stat(
                f"Success rate (SLO ≥ {availability.objective:.0%})",
                "Share of API responses over the selected range that are not a failure (a 5xx, or an error sent "
                "inside an event stream), as the availability SLO counts them.",
                success,
                "percentunit",
                thresholds("red", availability.objective - 4 * availability.budget, "yellow", availability.objective,
                           "green"),  # fmt: skip
            ),
            stat(
                "Requests per second",
                "API requests per second, now.",
                f"sum(rate({api}[$__rate_interval]))",
                "reqps",
                thresholds("blue"),
                sparkline=True,
            ),
            stat(
                "Generated tokens per second",
                "Output tokens per second across the selected models, now.",
                f"sum({rate('vigil_generation_tokens_total')})",
                TOKENS_PER_SECOND,
                thresholds("blue"),
                sparkline=True,
            ),
            stat(
                "Engine ready",
                "Whether every selected model's engine accepts requests (/readyz).",
                f"min({series('vigil_engine_ready')})",
                "none",
                thresholds("red", 1, "green"),
                mappings=[{"type": "value", "options": {"0": {"text": "Not ready"}, "1": {"text": "Ready"}}}],
                idle="no data",
            ),
            row("Golden signals"),
            timeseries(
                "Traffic: requests per second by route",
                "API requests per second, by route.",
                [target(f"sum by (route) (rate({api}[$__rate_interval]))", "{{route}}")],
                "reqps",
            ),
            timeseries(
                "Errors: share of requests failing",
                "5xx: server failures (the critical alert fires above 5%). Any error: also refusals "
                "such as validation, rate limiting or a full queue (see Service / Errors by reason).",
                [
                    target(
                        f"(sum(rate({api_5xx}[$__rate_interval])) or vector(0)) / sum(rate({api}[$__rate_interval]))",
                        "5xx",
                    ),
                    target(
                        f"sum({rate('vigil_request_errors_total')}) / sum(rate({api}[$__rate_interval]))", "any error"
                    ),
                ],
                "percentunit",
                min_value=0,
                limits=thresholds("green", 0.05, "red"),
            ),
            timeseries(
                "Latency: end-to-end and time to first token",
                "P50 and P99 of whole requests, and P99 time to first token against its SLO. "
                "Exemplar points open the trace of one request.",
                [
                    target(quantile(0.5, "vigil_request_duration_seconds"), "e2e p50 {{model}}", exemplar=True),
                    target(quantile(0.99, "vigil_request_duration_seconds"), "e2e p99 {{model}}", exemplar=True),
                    target(quantile(0.99, "vigil_time_to_first_token_seconds"), "ttft p99 {{model}}", exemplar=True),
                ],
                "s",
                limits=thresholds("green", ttft.threshold_seconds, "red"),
            ),
            timeseries(
                "Throughput: tokens per second",
                "Prompt tokens read and output tokens generated per second.",
                [
                    target(f"sum by (model) ({rate('vigil_prompt_tokens_total')})", "prompt {{model}}"),
                    target(f"sum by (model) ({rate('vigil_generation_tokens_total')})", "generated {{model}}"),
                ],
                TOKENS_PER_SECOND,
            ),
            timeseries(
                "Saturation: KV cache usage",
                "Share of KV cache blocks in use. Near 100% the scheduler starts preempting requests.",
                [
                    target(
                        f"max by (model, instance) ({series('vigil_kv_cache_usage_ratio')})", "{{model}} {{instance}}"
                    )
                ],
                "percentunit",
                min_value=0,
                max_value=1,
                limits=thresholds("green", 0.9, "orange", 0.95, "red"),
            ),
            timeseries(
                "Saturation: requests running and waiting",
                "Requests in the running batch and in the waiting queue. A queue that only grows means "
                "demand is above capacity.",
                [
                    target(f"sum by (model) ({series('vigil_num_requests_running')})", "running {{model}}"),
                    target(f"sum by (model) ({series('vigil_num_requests_waiting')})", "waiting {{model}}"),
                ],
            ),
        ],
    )


def infrastructure() -> dict:
    gpu = "{{instance}} GPU {{gpu}} ({{name}})"
    dcgm_gpu = "{{Hostname}} GPU {{gpu}} ({{modelName}})"
    return dashboard(
        "vigil-infrastructure",
        "Infrastructure",
        "GPUs, host and the Vigil process.",
        [
            row("GPUs (NVML, read by Vigil)"),
            stat(
                "GPUs",
                "GPUs Vigil sees, across the selected instances.",
                f"sum({series('vigil_gpu_count')})",
                "none",
                thresholds("blue"),
                width=4,
            ),
            timeseries(
                "GPU temperature",
                "Per GPU. Warning above 85 °C, critical above 90 °C.",
                [target(series("vigil_gpu_temperature_celsius"), gpu)],
                "celsius",
                width=10,
                limits=thresholds("green", 85, "orange", 90, "red"),
            ),
            timeseries(
                "GPU utilisation",
                "Share of time a kernel ran, per GPU. High is what an inference server wants: nothing alerts on it.",
                [target(series("vigil_gpu_utilization_ratio"), gpu)],
                "percentunit",
                width=10,
                min_value=0,
                max_value=1,
                limits=thresholds("green", 0.85, "orange"),
            ),
            timeseries(
                "GPU memory used and total",
                "Per GPU. High use is expected: the KV cache pool is allocated up front (see KV cache "
                "memory), so nothing alerts on it.",
                [
                    target(series("vigil_gpu_memory_used_bytes"), "used " + gpu),
                    target(series("vigil_gpu_memory_total_bytes"), "total " + gpu),
                ],
                "bytes",
                min_value=0,
            ),
            timeseries(
                "GPU power", "Power draw per GPU.", [target(series("vigil_gpu_power_watts"), gpu)], "watt", min_value=0
            ),
            timeseries(
                "GPU throttled",
                "1 while the GPU's clocks are held back by temperature or a hardware power brake (not the power cap "
                "that every full load reaches).",
                [target(series("vigil_gpu_throttled"), gpu)],
                "none",
                min_value=0,
                max_value=1,
                stepped=True,
            ),
            timeseries(
                "KV cache memory",
                "Memory reserved for the KV cache pool, per model, with the pool's dtype, block size and blocks.",
                [
                    target(
                        series("vigil_kv_cache_memory_bytes")
                        + " * on(model, instance) group_left(cache_dtype, block_size, num_blocks) "
                        + series("vigil_kv_cache_config_info"),
                        "{{model}} {{instance}}: {{num_blocks}} blocks of {{block_size}} tokens, {{cache_dtype}}",
                    )
                ],
                "bytes",
                min_value=0,
            ),
            timeseries(
                "Model weights memory",
                "Memory the model's weights take as stored, per model, with the engine's weight format: a "
                "quantised model (--quantization int8 or int4) keeps a quarter or an eighth of its fp32 bytes.",
                [
                    target(
                        series("vigil_model_weight_bytes")
                        + " * on(model, instance) group_left(quantization, weight_dtype, attention_backend) "
                        + series("vigil_engine_config_info"),
                        "{{model}} {{instance}}: {{quantization}} quantisation, {{weight_dtype}} weights, "
                        "{{attention_backend}} attention",
                    )
                ],
                "bytes",
                min_value=0,
            ),
            timeseries(
                "Hardware readings failed per minute",
                "NVML or /proc readings that failed, by field (device, temperature, memory, utilization, power, "
                "throttle, host_cpu, host_memory). A failed reading's series leaves its panel instead of freezing; "
                "VigilHardwareSamplingStale fires when no sample has succeeded for a while.",
                [target(f"sum by (field) ({rate('vigil_hardware_sample_errors_total')}) * 60", "{{field}}")],
                "short",
                width=12,
                min_value=0,
            ),
            row("GPU health (dcgm-exporter, in the compose gpu profile)"),
            timeseries(
                "XID errors",
                "The last XID each GPU reported (0: none). 48, 63, 64, 74, 79, 92, 94 and 95 mean the hardware "
                "failed and page; others (13, 31, 43) are usually a program's fault and open a ticket.",
                [target('DCGM_FI_DEV_XID_ERRORS{job="dcgm"}', dcgm_gpu)],
                "none",
                width=8,
                min_value=0,
                stepped=True,
            ),
            timeseries(
                "ECC errors",
                "Memory errors per GPU: corrected (single-bit) ones warn when they keep coming, uncorrectable "
                "(double-bit) ones page.",
                [
                    target('increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{job="dcgm"}[$__rate_interval])',
                           "corrected " + dcgm_gpu),
                    target('increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="dcgm"}[$__rate_interval])',
                           "uncorrectable " + dcgm_gpu),
                ],
                "short",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Remapped memory rows",
                "Rows remapped after errors (they take effect at the next GPU reset), and 1 where remapping failed "
                "(no spare rows left: the GPU needs replacing).",
                [
                    target('DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{job="dcgm"}', "uncorrectable " + dcgm_gpu),
                    target('DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{job="dcgm"}', "correctable " + dcgm_gpu),
                    target('DCGM_FI_DEV_ROW_REMAP_FAILURE{job="dcgm"}', "failed " + dcgm_gpu),
                ],
                "short",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Thermal throttling",
                "Share of time each GPU's clocks were held back for heat (DCGM's thermal violation time). Warning "
                "above 5% for 10 minutes. The power cap is not counted.",
                [target('rate(DCGM_FI_DEV_THERMAL_VIOLATION{job="dcgm"}[$__rate_interval]) / 1e6', dcgm_gpu)],
                "percentunit",
                min_value=0,
                limits=thresholds("green", 0.05, "orange"),
            ),
            row("Host and process"),
            timeseries(
                "Host CPU utilisation",
                "Share of all host CPUs busy.",
                [target(series("vigil_host_cpu_utilization_ratio"), "{{instance}}")],
                "percentunit",
                width=8,
                min_value=0,
                max_value=1,
            ),
            timeseries(
                "Host memory used and total",
                "Host RAM.",
                [
                    target(series("vigil_host_memory_used_bytes"), "used {{instance}}"),
                    target(series("vigil_host_memory_total_bytes"), "total {{instance}}"),
                ],
                "bytes",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Process RSS (resident memory)",
                "Resident memory of the Vigil process.",
                [target(series("process_resident_memory_bytes"), "{{instance}}")],
                "bytes",
                width=8,
                min_value=0,
            ),
            timeseries(
                "Process CPU (cores)",
                "CPU time the Vigil process uses per second, in cores.",
                [target(rate("process_cpu_seconds_total"), "{{instance}}")],
                "short",
                width=12,
                min_value=0,
            ),
            timeseries(
                "Process open file descriptors",
                "Open file descriptors against the process limit.",
                [
                    target(series("process_open_fds"), "open {{instance}}"),
                    target(series("process_max_fds"), "limit {{instance}}"),
                ],
                "short",
                width=12,
                min_value=0,
            ),
        ],
    )


def service() -> dict:
    return dashboard(
        "vigil-service",
        "Service",
        "Requests, latency, the scheduler and the KV cache.",
        [
            row("Traffic and errors"),
            timeseries(
                "Requests per second by code",
                "API requests per second, by HTTP status.",
                [target(f"sum by (code) ({rate('vigil_http_requests_total', API_ROUTES)})", "{{code}}")],
                "reqps",
                width=8,
                stacked=True,
            ),
            timeseries(
                "Errors by reason",
                "Refused or failed requests per second, by reason.",
                [target(f"sum by (reason) ({rate('vigil_request_errors_total')})", "{{reason}}")],
                "reqps",
                width=8,
                stacked=True,
            ),
            timeseries(
                "Engine ready",
                "1 while the engine accepts requests.",
                [target(series("vigil_engine_ready"), "{{model}} {{instance}}")],
                "none",
                width=8,
                min_value=0,
                max_value=1,
                stepped=True,
            ),
            row("Latency (exemplar points open the request's trace)"),
            timeseries(
                "End-to-end latency P50 / P95 / P99",
                "Whole requests, from arrival to the last token.",
                quantile_targets("vigil_request_duration_seconds"),
                "s",
            ),
            timeseries(
                "Time to first token P50 / P95 / P99",
                latency_slo_text(SLOS["time_to_first_token"]),
                quantile_targets("vigil_time_to_first_token_seconds"),
                "s",
                limits=thresholds("green", SLOS["time_to_first_token"].threshold_seconds, "red"),
            ),
            timeseries(
                "Inter-token latency P50 / P95 / P99",
                latency_slo_text(SLOS["inter_token_latency"]),
                quantile_targets("vigil_inter_token_latency_seconds"),
                "s",
                limits=thresholds("green", SLOS["inter_token_latency"].threshold_seconds, "red"),
            ),
            timeseries(
                "Queue time P50 / P95 / P99",
                "Time from arrival to admission into the running batch.",
                quantile_targets("vigil_request_queue_time_seconds"),
                "s",
            ),
            timeseries(
                "Prefill and decode time P50 / P95",
                "Time per request spent computing the prompt and generating the output.",
                [
                    target(
                        quantile(q, f"vigil_request_{phase}_time_seconds"),
                        f"{phase} p{round(q * 100)} {{{{model}}}}",
                        exemplar=True,
                    )
                    for phase in ("prefill", "decode")
                    for q in (0.5, 0.95)
                ],
                "s",
            ),
            timeseries(
                "Engine step duration P50 / P99",
                "One scheduler step: schedule, run the model, sample.",
                quantile_targets("vigil_engine_step_duration_seconds", (0.5, 0.99), exemplar=False),
                "s",
            ),
            row("Scheduler"),
            timeseries(
                "Requests running and waiting",
                "The running batch and the waiting queue.",
                [
                    target(f"sum by (model) ({series('vigil_num_requests_running')})", "running {{model}}"),
                    target(f"sum by (model) ({series('vigil_num_requests_waiting')})", "waiting {{model}}"),
                ],
                width=8,
            ),
            heatmap("Batch size distribution", "Requests per engine step.", "vigil_batch_size", "short", width=8),
            heatmap(
                "Tokens per step distribution",
                "Tokens computed per engine step (prefill chunks and decodes).",
                "vigil_batch_tokens",
                "short",
                width=8,
            ),
            row("KV cache"),
            timeseries(
                "KV cache usage",
                "Share of KV blocks in use. Warning above 90% for 10 minutes.",
                [target(series("vigil_kv_cache_usage_ratio"), "{{model}} {{instance}}")],
                "percentunit",
                width=6,
                min_value=0,
                max_value=1,
                limits=thresholds("green", 0.9, "orange", 0.95, "red"),
            ),
            timeseries(
                "KV cache blocks used and free",
                "Blocks of the KV pool.",
                [target(f"sum by (state) ({series('vigil_kv_cache_blocks')})", "{{state}}")],
                "short",
                width=6,
                stacked=True,
            ),
            timeseries(
                "Preemptions per minute",
                "Requests evicted from the batch to free KV blocks; they recompute.",
                [target(f"sum by (model) ({rate('vigil_preemptions_total')}) * 60", "{{model}}")],
                "short",
                width=6,
                min_value=0,
            ),
            timeseries(
                "Prefix cache hit rate",
                "Share of prompt tokens found in the prefix cache.",
                [
                    target(
                        f"sum by (model) ({rate('vigil_prefix_cache_hits_total')}) / "
                        f"sum by (model) ({rate('vigil_prefix_cache_queries_total')})",
                        "{{model}}",
                    )
                ],
                "percentunit",
                width=6,
                min_value=0,
                max_value=1,
            ),
            timeseries(
                "KV cache waste",
                "Share of the KV slots held by running requests that hold no token yet: the unfilled tail of "
                "each request's last block. Paged allocation keeps it to a few percent.",
                [target(series("vigil_kv_cache_waste_ratio"), "{{model}} {{instance}}")],
                "percentunit",
                width=12,
                min_value=0,
                max_value=1,
            ),
        ],
    )


def model() -> dict:
    return dashboard(
        "vigil-model",
        "Model",
        "What the model is asked and what it answers.",
        [
            row("Throughput"),
            timeseries(
                "Tokens per second",
                "Prompt tokens read and output tokens generated per second, and the "
                "engine's own generation throughput.",
                [
                    target(f"sum by (model) ({rate('vigil_prompt_tokens_total')})", "prompt {{model}}"),
                    target(f"sum by (model) ({rate('vigil_generation_tokens_total')})", "generated {{model}}"),
                    target(
                        f"sum by (model) ({series('vigil_generation_throughput_tokens_per_second')})",
                        "engine throughput {{model}}",
                    ),
                ],
                TOKENS_PER_SECOND,
            ),
            timeseries(
                "Per-request output speed P10 / P50 / P90",
                f"Decode tokens per second of single requests; P10 is the slow tail. "
                f"Target: P50 ≥ {OUTPUT_SPEED_P50_TARGET} tok/s.",
                quantile_targets("vigil_request_decode_speed_tokens_per_second", (0.1, 0.5, 0.9), exemplar=False),
                TOKENS_PER_SECOND,
                limits=thresholds("red", OUTPUT_SPEED_P50_TARGET, "green"),
            ),
            timeseries(
                "Model FLOPs utilisation",
                "The model's FLOPs per second of engine-busy time over the device's torch.mm peak in the "
                "model's dtype (measured at start), over the last 10 s; and the FLOPs rate itself.",
                [
                    target(series("vigil_model_flops_utilization_ratio"), "MFU {{model}} {{instance}}"),
                    target(
                        f"sum by (model) ({rate('vigil_model_flops_total')}) / "
                        f"sum by (model) ({series('vigil_matmul_peak_flops_per_second')})",
                        "FLOPs rate / peak {{model}}",
                    ),
                ],
                "percentunit",
                width=24,
                min_value=0,
            ),
            row("Requests"),
            heatmap("Prompt length distribution", "Prompt tokens per request.", "vigil_request_prompt_tokens", "short"),
            heatmap(
                "Output length distribution",
                "Generated tokens per request.",
                "vigil_request_generation_tokens",
                "short",
            ),
            heatmap(
                "Temperature distribution",
                "Sampling temperature requested.",
                "vigil_request_temperature",
                "short",
                width=8,
            ),
            heatmap("Top-p distribution", "Nucleus sampling top_p requested.", "vigil_request_top_p", "short", width=8),
            heatmap(
                "max_tokens distribution", "The output budget requested.", "vigil_request_max_tokens", "short", width=8
            ),
            row("Output quality"),
            timeseries(
                "Finish reasons",
                "Finished requests per second by reason: stop, length, abort, ...",
                [target(f"sum by (finish_reason) ({rate('vigil_request_finished_total')})", "{{finish_reason}}")],
                "reqps",
                width=8,
                stacked=True,
            ),
            timeseries(
                "Repetition ratio P95",
                "Share of repeated n-grams in the output; near 1 means a loop.",
                [target(quantile(0.95, "vigil_output_repetition_ratio"), "p95 {{model}}")],
                "percentunit",
                width=8,
                min_value=0,
                max_value=1,
            ),
            timeseries(
                "Anomalies by kind",
                "Outputs flagged per minute: repetition loops, empty outputs, outputs cut at max_tokens.",
                [target(f"sum by (kind) ({rate('vigil_output_anomalies_total')}) * 60", "{{kind}}")],
                "short",
                width=8,
                min_value=0,
                stacked=True,
            ),
            row("Speculative decoding"),
            timeseries(
                "Speculative tokens and acceptance rate",
                "With --speculative-config: guesses checked and kept per second, and the share kept (as vLLM's "
                "speculative-decoding metrics). A low rate means the guesses cost more than they save.",
                [
                    target(f"sum by (model) ({rate('vigil_spec_decode_num_draft_tokens_total')})", "drafted {{model}}"),
                    target(f"sum by (model) ({rate('vigil_spec_decode_num_accepted_tokens_total')})",
                           "accepted {{model}}"),
                ],
                TOKENS_PER_SECOND,
                width=8,
                min_value=0,
            ),
            timeseries(
                "Acceptance rate",
                "Speculative tokens kept over those checked.",
                [target(f"sum by (model) ({rate('vigil_spec_decode_num_accepted_tokens_total')}) / "
                        f"sum by (model) ({rate('vigil_spec_decode_num_draft_tokens_total')})", "{{model}}")],
                "percentunit",
                width=8,
                min_value=0,
                max_value=1,
            ),
            heatmap(
                "Guesses kept per step",
                "Speculative tokens kept per request per step.",
                "vigil_spec_decode_accepted_length",
                "short",
                width=8,
            ),
            row("Routing"),
            timeseries(
                "Routing decisions",
                "Requests sent to an alias such as auto, per second, by the model its policy chose and why: simple, "
                "long prompt, long output, a hard rule, or overflow while the large model's queue is long.",
                [target(f"sum by (alias, model, reason) ({rate('vigil_router_decisions_total')})",
                        "{{alias}} → {{model}} ({{reason}})")],
                "reqps",
                width=24,
                min_value=0,
                stacked=True,
            ),
        ],
    )


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    dashboards = {
        "overview": overview(), "infrastructure": infrastructure(), "service": service(), "model": model(),
        "slo": slo_dashboard(list(SLOS.values())), "fleet": fleet_dashboard(),
    }
    return {
        f"{name}.json": json.dumps(board, indent=2, ensure_ascii=False) + "\n" for name, board in dashboards.items()
    }


def main(argv: list[str]) -> int:
    stale = []
    for name, text in render().items():
        path = HERE / name
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python dashboards/build.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
