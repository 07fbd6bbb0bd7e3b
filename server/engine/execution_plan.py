"""How every step runs, decided once when the engine is built, and said: the decode path, the kernel of each kind
of weight matrix, the attention kernel, the KV cache's dtype, the sampler's greedy kernel, the CPU kernels'
variant, the process's memory allocator, and why. The builder logs it, ``vigil serve --print-plan`` prints it,
and ``vigil_engine_config_info`` carries it; the model runner executes it."""

from dataclasses import dataclass

from server.allocator import process_allocator
from server.config import DECODE_PATHS
from server.engine.decode_graphs import graph_batch_sizes
from server.models.decoder import DecoderModel
from server.models.interface import Model
from server.models.one_call_decode import OneCallDecode, build_one_call_decode, one_call_refusal


@dataclass(frozen=True)
class ExecutionPlan:
    decode_path: str  # "one-call": every step's layers, prompt rows too, in one compiled call; "cuda-graphs": the
    # layer loop captured in a CUDA graph per batch size and replayed for decode steps; "layer-loop": the Python loop
    decode_path_reason: str
    decode_graph_sizes: tuple[int, ...]  # the batch sizes captured under "cuda-graphs"; empty otherwise
    attention: str  # the attention backend: "cpu", "cpu-batch-invariant", "triton" or "torch"
    prompt_attention: str  # the kernel that attends prompt rows, where the backend has a choice
    layer_ops: str  # norms, rotary, activation: "cpu", "triton" or "torch"
    linear_kernels: dict[str, str]  # each kind of weight matrix and the kernel that multiplies by it
    kv_cache_dtype: str
    sampler: str  # the kernel that picks greedy rows' tokens; sampled rows are torch's
    cpu_kernels: str  # the C++ kernels' ISA variant, "torch" without them, "none" off the CPU
    tensor_parallel_size: int
    allocator: str  # the process's malloc: "jemalloc" (server/allocator.py), "tcmalloc" or "system"

    @property
    def linear_kernel_summary(self) -> str:
        """One kernel where every kind takes the same, else each kind's, for a metric label."""
        kernels = set(self.linear_kernels.values())
        if len(kernels) == 1:
            return kernels.pop()
        return ",".join(f"{kind}={kernel}" for kind, kernel in self.linear_kernels.items())

    def describe(self) -> list[str]:
        graphs = f" over batch sizes {', '.join(map(str, self.decode_graph_sizes))}" if self.decode_graph_sizes else ""
        return [
            f"decode path: {self.decode_path} ({self.decode_path_reason}){graphs}",
            f"attention: {self.attention} (prompts: {self.prompt_attention}); layer ops: {self.layer_ops}; "
            f"KV cache: {self.kv_cache_dtype}",
            "linear kernels: " + ", ".join(f"{kind} {kernel}" for kind, kernel in self.linear_kernels.items()),
            f"sampler: greedy rows by the {self.sampler} argmax, sampled rows by torch",
            f"CPU kernels: {self.cpu_kernels}; tensor parallel size: {self.tensor_parallel_size}; "
            f"memory allocator: {self.allocator}",
        ]


def plan_execution(model: Model, decode_path: str, kv_cache_dtype: str, cpu_kernels: str,
                   tensor_parallel_size: int, max_num_seqs: int) -> tuple[ExecutionPlan, OneCallDecode | None]:
    """The plan for ``model`` as loaded, and the compiled decode loop where the plan takes it. ``decode_path``
    "auto" takes the one-call loop wherever it can run; "one-call" and "cuda-graphs" raise ValueError where they
    cannot."""
    if decode_path not in DECODE_PATHS:
        raise ValueError(f"decode path {decode_path!r}: choose one of {', '.join(DECODE_PATHS)}")
    if decode_path == "cuda-graphs":
        if refusal := cuda_graphs_refusal(model, tensor_parallel_size):
            raise ValueError(f"--decode-path cuda-graphs cannot run here: {refusal}")
        return _plan(model, "cuda-graphs", "chosen with --decode-path cuda-graphs", kv_cache_dtype, cpu_kernels,
                     tensor_parallel_size, graph_batch_sizes(max_num_seqs)), None
    if not isinstance(model, DecoderModel):
        refusal = "tensor parallelism: the compiled loop has no all-reduce between layers"
    else:
        refusal = one_call_refusal(model)
    if decode_path == "one-call" and refusal:
        raise ValueError(f"--decode-path one-call cannot run this model here: {refusal}")
    one_call = None
    if decode_path == "layer-loop":
        path, reason = "layer-loop", "chosen with --decode-path layer-loop"
    elif refusal:
        path, reason = "layer-loop", refusal
    else:
        path, reason = "one-call", "every layer is llama-style over weights the compiled loop takes"
        one_call = build_one_call_decode(model)
    return _plan(model, path, reason, kv_cache_dtype, cpu_kernels, tensor_parallel_size, ()), one_call


def cuda_graphs_refusal(model: Model, tensor_parallel_size: int) -> str | None:
    """Why decode steps cannot be captured in CUDA graphs here, or None where they can."""
    device = model.attention.device
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; this engine runs on {device.type}"
    if tensor_parallel_size > 1:
        return "tensor parallelism: the workers' forward passes are not captured"
    if model.attention.name != "triton":
        return f"the {model.attention.name} attention backend is not captured; the triton one is"
    return None


def _plan(model: Model, path: str, reason: str, kv_cache_dtype: str, cpu_kernels: str, tensor_parallel_size: int,
          graph_sizes: tuple[int, ...]) -> ExecutionPlan:
    return ExecutionPlan(
        decode_path=path, decode_path_reason=reason, decode_graph_sizes=graph_sizes, attention=model.attention.name,
        prompt_attention=model.attention.prompt_attention,
        layer_ops=model.layer_ops.name, linear_kernels=model.linear_kernels(), kv_cache_dtype=kv_cache_dtype,
        sampler=model.layer_ops.name, cpu_kernels=cpu_kernels, tensor_parallel_size=tensor_parallel_size,
        allocator=process_allocator(),
    )
