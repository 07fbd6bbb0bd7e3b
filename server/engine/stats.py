"""Plain stats dataclasses, the engine's only outward telemetry. Consumers live outside ``server/engine``."""

from dataclasses import dataclass, field

from server.engine.request import SamplingParams


@dataclass(frozen=True)
class CacheInfo:
    """The KV pool as sized at start."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    device: str
    dtype: str  # of K and V, e.g. "float16"

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


@dataclass(frozen=True)
class EngineInfo:
    """How the engine computes, as built: the attention backend that serves, and the dtypes."""

    attention_backend: str  # "cpu" (C++ kernels), "cpu-batch-invariant", "triton" or "torch"
    dtype: str  # of activations, e.g. "float32"
    weight_dtype: str
    device: str
    quantization: str  # "int8", "int4" or "none"
    weight_bytes: int  # over every tensor-parallel rank
    tensor_parallel_size: int = 1
    cpu_kernels: str = "none"  # the C++ kernels' ISA variant ("avx2" ... "amx"), "torch" without them, "none" off CPU
    decode_path: str = "layer-loop"  # the execution plan's (server/engine/execution_plan.py)
    linear_kernels: str = "torch"  # the plan's kernel for every kind of weight matrix, or each kind's
    allocator: str = "system"  # the process's malloc, as the plan says


@dataclass(frozen=True)
class RequestEvent:
    """A moment in a request's life: ``queued``, ``scheduled``, ``first_token`` or ``preempted``."""

    request_id: str
    kind: str
    timestamp: float


@dataclass(frozen=True)
class FinishedRequestStats:
    """Everything known about a request once it has ended. Timestamps are ``time.monotonic()`` values."""

    request_id: str
    finish_reason: str
    stop_reason: str | int | None
    arrival_time: float
    queued_time: float | None
    scheduled_time: float | None
    first_token_time: float | None
    last_token_time: float | None
    finished_time: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    max_tokens: int
    sampling_params: SamplingParams
    output_token_ids: tuple[int, ...]

    def timings(self) -> dict[str, float | None]:
        """Queue, prefill, decode and end-to-end intervals in seconds; None where a moment was never reached."""

        def between(start: float | None, end: float | None) -> float | None:
            return None if start is None or end is None else max(0.0, end - start)

        return {
            "queue_s": between(self.arrival_time, self.scheduled_time),
            "ttft_s": between(self.arrival_time, self.first_token_time),
            "prefill_s": between(self.scheduled_time, self.first_token_time),
            "decode_s": between(self.first_token_time, self.last_token_time),
            "duration_s": between(self.arrival_time, self.finished_time),
        }


@dataclass(frozen=True)
class StepStats:
    """One engine step: what was scheduled, how the pool stood, and what came out.

    ``num_prompt_tokens``, ``num_generation_tokens`` and ``finished`` cover clients' requests only (what was
    served); the server's own canaries are in the step's work (``model_flops``, the batch) but not in those."""

    timestamp: float
    step_duration_s: float
    num_running: int
    num_waiting: int
    num_kv_blocks_used: int
    num_kv_blocks_total: int
    num_kv_slots_held: int
    num_kv_slots_filled: int
    num_scheduled_tokens: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_prompt_tokens: int
    num_generation_tokens: int
    model_flops: int
    num_draft_tokens: int = 0  # speculative guesses checked this step
    accepted_lengths: list[int] = field(default_factory=list)  # guesses kept, per request that had some
    inter_token_latencies_s: list[float] = field(default_factory=list)
    # Clients' requests whose first token came this step: request id to arrival-to-first-token seconds.
    time_to_first_token_s: dict[str, float] = field(default_factory=dict)
    # Per tensor-parallel rank (rank 0 first), the wall time of its forward pass; empty on one process.
    rank_step_durations_s: tuple[float, ...] = ()
    events: list[RequestEvent] = field(default_factory=list)
    finished: list[FinishedRequestStats] = field(default_factory=list)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted_lengths)

    @property
    def num_scheduled_seqs(self) -> int:
        return self.num_prefill_seqs + self.num_decode_seqs

    @property
    def kv_cache_waste_ratio(self) -> float:
        """Slots held by running requests but not yet filled, over the slots they hold (shared blocks count once
        per holder on both sides)."""
        if not self.num_kv_slots_held:
            return 0.0
        return 1.0 - self.num_kv_slots_filled / self.num_kv_slots_held
