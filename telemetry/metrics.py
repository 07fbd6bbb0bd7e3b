"""Every Prometheus metric Vigil exports, defined once. docs/metrics.md lists them; a test keeps both in step."""

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY

from server.config_values import LATENCY_BUCKETS

BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(10))
TOKEN_COUNT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
TEMPERATURE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.2, 1.5, 2.0)
TOP_P_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
SPEC_LENGTH_BUCKETS = tuple(float(n) for n in range(9))
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

ERROR_REASONS = (
    "validation", "unauthorized", "payload_too_large", "rate_limited", "queue_full", "not_ready",
    "client_disconnect", "engine", "stream_error",
)
ANOMALY_KINDS = ("repetition_loop", "empty", "length_capped")
FINISH_REASONS = ("stop", "length", "abort")
ENGINE_PHASES = ("loading", "warming_up", "serving", "draining", "dead")
# Why a routing policy chose a model (server/api/routing_policy.py).
ROUTING_REASONS = ("simple", "long_prompt", "long_output", "hard_rule", "overflow")
GPU_LABELS = ("gpu", "name")
HARDWARE_FIELDS = ("device", "temperature", "memory", "utilization", "power", "throttle", "host_cpu", "host_memory")


class VigilMetrics:
    """The metric objects, registered in ``registry`` (a fresh one in tests). ``model`` is the first served model;
    a server with several registers the others with ``add_model``: one set of metrics, one ``model`` label value
    each."""

    def __init__(
        self,
        model: str,
        registry: CollectorRegistry = REGISTRY,
        latency_buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self.model = model
        self.registry = registry
        m = ("model",)

        def counter(name: str, doc: str, labels: Sequence[str] = m) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def gauge(name: str, doc: str, labels: Sequence[str] = m) -> Gauge:
            return Gauge(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = m) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        # Infrastructure
        self.gpu_temperature = gauge("vigil_gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS)
        self.gpu_memory_used = gauge("vigil_gpu_memory_used_bytes", "GPU memory in use.", GPU_LABELS)
        self.gpu_memory_total = gauge("vigil_gpu_memory_total_bytes", "GPU memory in all.", GPU_LABELS)
        self.gpu_utilization = gauge("vigil_gpu_utilization_ratio", "Share of time the GPU was busy.", GPU_LABELS)
        self.gpu_power = gauge("vigil_gpu_power_watts", "GPU power draw.", GPU_LABELS)
        self.gpu_throttled = gauge(
            "vigil_gpu_throttled",
            "1 while the GPU clocks are held back by temperature or a hardware power brake (not the power cap).",
            GPU_LABELS,
        )
        self.gpu_count = gauge("vigil_gpu_count", "GPUs visible through NVML (0 without NVML).", ())
        self.host_cpu = gauge("vigil_host_cpu_utilization_ratio", "Host CPU busy share, all cores.", ())
        self.host_memory_used = gauge("vigil_host_memory_used_bytes", "Host memory in use.", ())
        self.host_memory_total = gauge("vigil_host_memory_total_bytes", "Host memory in all.", ())
        self.hardware_sample_errors = counter(
            "vigil_hardware_sample_errors_total", "Hardware readings that failed, by field.", ("field",)
        )
        self.hardware_last_success = gauge(
            "vigil_hardware_last_success_timestamp_seconds",
            "Unix time of the last hardware sample in which every reading succeeded.",
            (),
        )
        self.kv_cache_memory = gauge("vigil_kv_cache_memory_bytes", "Size of the KV cache pool.")
        self.kv_cache_config = gauge(
            "vigil_kv_cache_config_info",
            "1, labelled with the KV cache pool's layout as sized at start.",
            (*m, "block_size", "num_blocks", "cache_dtype", "device"),
        )

        # Service
        self.http_requests = counter(
            "vigil_http_requests_total", "HTTP responses by route template and status code.", ("route", "code")
        )
        self.request_errors = counter(
            "vigil_request_errors_total", "Requests that failed, by reason.", ("reason",)
        )
        self.request_duration = histogram(
            "vigil_request_duration_seconds", "End-to-end request latency.", latency_buckets
        )
        self.time_to_first_token = histogram(
            "vigil_time_to_first_token_seconds", "Arrival to first output token.", latency_buckets
        )
        self.inter_token_latency = histogram(
            "vigil_inter_token_latency_seconds", "Gap between consecutive output tokens.", latency_buckets
        )
        self.queue_time = histogram(
            "vigil_request_queue_time_seconds", "Arrival to first scheduling.", latency_buckets
        )
        self.prefill_time = histogram(
            "vigil_request_prefill_time_seconds", "First scheduling to first token.", latency_buckets
        )
        self.decode_time = histogram(
            "vigil_request_decode_time_seconds", "First token to last token.", latency_buckets
        )
        self.num_running = gauge("vigil_num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("vigil_num_requests_waiting", "Requests in the waiting queue.")
        self.batch_size = histogram("vigil_batch_size", "Sequences per engine step.", BATCH_SIZE_BUCKETS)
        self.batch_tokens = histogram("vigil_batch_tokens", "Tokens per engine step.", TOKEN_COUNT_BUCKETS)
        self.step_duration = histogram(
            "vigil_engine_step_duration_seconds", "Wall time of one engine step.", latency_buckets
        )
        self.rank_step_duration = histogram(
            "vigil_tensor_parallel_rank_step_duration_seconds",
            "Wall time of one tensor-parallel rank's forward pass in an engine step.", latency_buckets,
            ("model", "rank"),
        )
        self.kv_cache_usage = gauge("vigil_kv_cache_usage_ratio", "Share of KV cache blocks in use.")
        self.kv_cache_blocks = gauge("vigil_kv_cache_blocks", "KV cache blocks by state.", ("model", "state"))
        self.kv_cache_waste = gauge(
            "vigil_kv_cache_waste_ratio", "Share of the KV slots held by running requests that hold no token yet."
        )
        self.preemptions = counter("vigil_preemptions_total", "Requests preempted (by recompute).")
        self.prefix_cache_queries = counter(
            "vigil_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter("vigil_prefix_cache_hits_total", "Prompt tokens served from the prefix cache.")
        self.engine_ready = gauge(
            "vigil_engine_ready", "1 while the engine is ready: serving, and proven by its requests or a canary."
        )
        self.engine_phase = gauge(
            "vigil_engine_phase", "1 for the phase the server is in: loading, warming_up, serving, draining or dead.",
            ("model", "phase"),
        )
        self.engine_config = gauge(
            "vigil_engine_config_info",
            "1, labelled with how the engine computes: its attention backend, dtypes, CPU kernel variant, its "
            "execution plan's decode path and linear kernels, and the process's memory allocator.",
            ("model", "attention_backend", "dtype", "weight_dtype", "quantization", "device", "tensor_parallel_size",
             "cpu_kernels", "decode_path", "linear_kernels", "allocator"),
        )
        self.model_weight_bytes = gauge(
            "vigil_model_weight_bytes", "Memory the model's weights take, as stored (quantised or not)."
        )

        # Model
        self.prompt_tokens = counter("vigil_prompt_tokens_total", "Prompt tokens computed.")
        self.generation_tokens = counter("vigil_generation_tokens_total", "Output tokens generated.")
        self.generation_throughput = gauge(
            "vigil_generation_throughput_tokens_per_second", "Output tokens per second over the last 10 s."
        )
        self.model_flops = counter(
            "vigil_model_flops_total", "Floating-point operations of the model's forward passes."
        )
        self.matmul_peak = gauge(
            "vigil_matmul_peak_flops_per_second", "The device's torch.mm peak in the model's dtype, measured at start."
        )
        self.flops_utilization = gauge(
            "vigil_model_flops_utilization_ratio",
            "Model FLOPs per second of engine-busy time over the matmul peak, over the last 10 s.",
        )
        self.spec_decode_draft_tokens = counter(
            "vigil_spec_decode_num_draft_tokens_total", "Speculative tokens guessed and checked."
        )
        self.spec_decode_accepted_tokens = counter(
            "vigil_spec_decode_num_accepted_tokens_total", "Speculative tokens the target model kept."
        )
        self.spec_decode_accepted_length = histogram(
            "vigil_spec_decode_accepted_length", "Speculative tokens kept per request per step.", SPEC_LENGTH_BUCKETS
        )
        self.request_prompt_tokens = histogram(
            "vigil_request_prompt_tokens", "Prompt length per request.", TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vigil_request_generation_tokens", "Output length per request.", TOKEN_COUNT_BUCKETS
        )
        self.request_decode_speed = histogram(
            "vigil_request_decode_speed_tokens_per_second", "Output tokens per second of decode, per request.",
            SPEED_BUCKETS,
        )
        self.request_temperature = histogram(
            "vigil_request_temperature", "Sampling temperature per request.", TEMPERATURE_BUCKETS
        )
        self.request_top_p = histogram("vigil_request_top_p", "Sampling top_p per request.", TOP_P_BUCKETS)
        self.request_max_tokens = histogram(
            "vigil_request_max_tokens", "Effective max_tokens per request.", TOKEN_COUNT_BUCKETS
        )
        self.request_finished = counter(
            "vigil_request_finished_total", "Finished requests by finish reason.", ("model", "finish_reason")
        )
        self.repetition_ratio = histogram(
            "vigil_output_repetition_ratio", "1 - distinct 4-grams / total 4-grams of the output.", RATIO_BUCKETS
        )
        self.output_anomalies = counter(
            "vigil_output_anomalies_total", "Degenerate outputs by kind.", ("model", "kind")
        )

        # Routing
        self.router_decisions = counter(
            "vigil_router_decisions_total",
            "Requests sent to a model alias (such as auto), by the model its routing policy chose and why.",
            ("alias", "model", "reason"),
        )
        self._initialise_label_sets()

    def add_model(self, model: str) -> None:
        """Another served model's closed label sets, at zero."""
        for kind in ANOMALY_KINDS:
            self.output_anomalies.labels(model, kind)
        for reason in FINISH_REASONS:
            self.request_finished.labels(model, reason)
        for state in ("used", "free"):
            self.kv_cache_blocks.labels(model, state)
        for phase in ENGINE_PHASES:
            self.engine_phase.labels(model, phase)

    def add_alias(self, alias: str, models: Sequence[str]) -> None:
        """A routing alias's decisions, at zero for every model it may choose and every reason."""
        for model in models:
            for reason in ROUTING_REASONS:
                self.router_decisions.labels(alias, model, reason)

    def _initialise_label_sets(self) -> None:
        """Closed label sets start at zero, so that rates and alerts see them before the first event."""
        for reason in ERROR_REASONS:
            self.request_errors.labels(reason)
        self.add_model(self.model)
        for field in HARDWARE_FIELDS:
            self.hardware_sample_errors.labels(field)
        self.gpu_count.set(0)
