"""The attention backend interface, and the one dispatch point between the kernel implementations.

A backend turns one step's batch into metadata once (``prepare``: tensors on the device, plus the host-side sizes
its kernels need, so that no layer syncs with the device to learn them), then runs every layer's attention over
the paged cache from it (``forward``: store the new K/V, decode rows, prefill rows). A layer with sliding-window
attention passes its ``window``: each query then sees the ``window`` keys up to its own position.

- ``triton``: the Triton kernels; the default for CUDA tensors.
- ``cpu``: the compiled C++ kernels (attention, the KV store, the elementwise layer ops); the default elsewhere,
  falling back to ``torch`` where no C++ compiler is available.
- ``torch``: ``kernels.reference`` alone, the oracle.

``VIGIL_ATTENTION_BACKEND=torch|triton|cpu`` overrides the choice.
"""

import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from kernels import reference

BACKEND_ENV = "VIGIL_ATTENTION_BACKEND"
BACKENDS = ("torch", "triton", "cpu")


@dataclass(frozen=True)
class AttentionBatch:
    """One step's tokens as attention sees them, in host lists.

    Rows ``[:num_decode_tokens]`` decode: each is one query over the first ``decode_seq_lens[i]`` keys of its block
    table (a sequence's next token, or one of the speculative guesses after it, whose rows share the table). The
    rest are chunks of several tokens (prefill), sequence ``i`` owning rows
    ``prefill_query_starts[i]:prefill_query_starts[i + 1]`` of them. Block tables are rows of block ids, and
    ``*_seq_lens`` count every context token, the new ones included.
    """

    slot_mapping: list[int]
    decode_block_tables: list[list[int]]
    decode_seq_lens: list[int]
    prefill_block_tables: list[list[int]]
    prefill_query_starts: list[int]
    prefill_seq_lens: list[int]

    @property
    def num_decode_tokens(self) -> int:
        return len(self.decode_seq_lens)


@dataclass(frozen=True)
class AttentionMetadata:
    """An AttentionBatch on the device, built once per step and read by every layer."""

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_seq_lens: torch.Tensor
    decode_max_seq_len: int
    prefill_block_tables: torch.Tensor
    prefill_cu_seqlens_q: torch.Tensor
    prefill_seq_lens: torch.Tensor
    prefill_query_starts: list[int]
    prefill_context_lens: list[int]

    @property
    def prefill_max_query_len(self) -> int:
        starts = self.prefill_query_starts
        return max((end - start for start, end in zip(starts, starts[1:], strict=False)), default=0)


def _block_tables(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Rows padded with block 0 (any valid id does: kernels read only up to each sequence's length)."""
    width = max((len(row) for row in rows), default=0)
    padded = [row + [0] * (width - len(row)) for row in rows]
    return torch.tensor(padded, dtype=torch.int32, device=device).reshape(len(rows), width)


class AttentionBackend(ABC):
    """Paged attention over ``[num_blocks, block_size, num_kv_heads, head_dim]`` K and V caches."""

    name: str
    batch_invariant = False  # whether a row's result is the same bits whatever else the batch holds

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def prompt_attention(self) -> str:
        """The kernel that attends prompt (prefill) rows, as the execution plan says it."""
        return f"the {self.name} backend's prefill kernel"

    def prepare(self, batch: AttentionBatch) -> AttentionMetadata:
        device = self.device

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        return AttentionMetadata(
            slot_mapping=torch.tensor(batch.slot_mapping, dtype=torch.int64, device=device),
            num_decode_tokens=batch.num_decode_tokens,
            decode_block_tables=_block_tables(batch.decode_block_tables, device),
            decode_seq_lens=ints(batch.decode_seq_lens),
            decode_max_seq_len=max(batch.decode_seq_lens, default=0),
            prefill_block_tables=_block_tables(batch.prefill_block_tables, device),
            prefill_cu_seqlens_q=ints(batch.prefill_query_starts),
            prefill_seq_lens=ints(batch.prefill_seq_lens),
            prefill_query_starts=batch.prefill_query_starts,
            prefill_context_lens=batch.prefill_seq_lens,
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """Store ``k``/``v`` (``[tokens, kv_heads, head_dim]``) in their slots, then attend: ``q`` is
        ``[tokens, heads, head_dim]``, and so is the result."""
        k_cache, v_cache = kv_cache
        self.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        num_decode = meta.num_decode_tokens
        if num_decode == q.shape[0]:
            return self.decode(q, k_cache, v_cache, meta, scale, window)
        if not num_decode:
            return self.prefill(q, k, v, k_cache, v_cache, meta, scale, window)
        out = torch.empty_like(q)
        out[:num_decode] = self.decode(q[:num_decode], k_cache, v_cache, meta, scale, window)
        new = slice(num_decode, None)
        out[new] = self.prefill(q[new], k[new], v[new], k_cache, v_cache, meta, scale, window)
        return out

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None: ...

    @abstractmethod
    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None,
    ) -> torch.Tensor: ...

    @abstractmethod
    def prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, scale: float, window: int | None = None,
    ) -> torch.Tensor:
        """The prefill rows: their queries, and their own keys and values, already stored in the caches."""
        ...


class TorchAttention(AttentionBackend):
    name = "torch"

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        reference.store_kv(k, v, k_cache, v_cache, slots)

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        return reference.paged_decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale,
            max_seq_len=meta.decode_max_seq_len, window=window,
        )

    def prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, scale: float, window: int | None = None,
    ) -> torch.Tensor:
        return reference.paged_prefill_attention(
            q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, scale,
            query_starts=meta.prefill_query_starts, context_lens=meta.prefill_context_lens, window=window,
        )


class CpuAttention(AttentionBackend):
    """The compiled C++ kernels; they read their sizes from the tensors on the host, with no sync to pay.

    Every prompt row takes the paged prefill kernel, on AMX tiles for bf16 queries where they are granted and a
    sequence brings enough new tokens (kernels/csrc/paged_prefill_amx.cpp): there it also beats torch's flash
    attention over a prompt's own keys
    (0.63x its time for 128 new tokens of SmolLM2's heads, 0.47x for 512), which this backend used to call for
    prompts with no cached context."""

    name = "cpu"
    # A step's prompt rows take the AMX tiles when a sequence brings this many new tokens. Steps of a few tokens a
    # sequence (speculation's verification of its guesses) stay on the kernel they took before the tiles: alone,
    # the tiles took 0.79-0.86x its time at 5 tokens over 256-2000, but a step that touches no tile is not
    # measured to gain from one.
    tiles_from_new_tokens = 16

    def __init__(self, device: torch.device, compiled: ModuleType) -> None:
        super().__init__(device)
        self.compiled = compiled

    @property
    def prompt_attention(self) -> str:
        if self.compiled.amx_linear_usable():
            return f"the paged kernel (on AMX tiles for bf16 queries, from {self.tiles_from_new_tokens} new tokens)"
        return "the paged kernel"

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        self.compiled.store_kv(k, v, k_cache, v_cache, slots)

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        return self.compiled.paged_decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale, window or 0
        )

    def prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, scale: float, window: int | None = None,
    ) -> torch.Tensor:
        return self.compiled.paged_prefill_attention(
            q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, scale,
            window or 0, self.prompt_on_tiles(meta),
        )

    def prompt_on_tiles(self, meta: AttentionMetadata) -> bool:
        """Whether this step's prompt rows take the AMX tiles (the compiled layer loop asks too)."""
        return meta.prefill_max_query_len >= self.tiles_from_new_tokens


class BatchInvariantCpuAttention(CpuAttention):
    """Every row through the one paged prefill kernel, a decoding sequence as a one-token chunk. That kernel sums a
    query's keys in the same order however its sequence is chunked and whatever other sequences share the call, so a
    token's attention is the same bits alone, in a batch, prefilled or decoded (tests/test_batch_invariant.py).
    So every step takes the one kernel, never the AMX one, which serves only steps with long enough prompts."""

    name = "cpu-batch-invariant"
    batch_invariant = True

    @property
    def prompt_attention(self) -> str:
        return "the paged kernel (never on AMX tiles: one kernel for every row)"

    def prompt_on_tiles(self, meta: AttentionMetadata) -> bool:
        return False

    def prepare(self, batch: AttentionBatch) -> AttentionMetadata:
        decoding = batch.num_decode_tokens  # prefill_query_starts begins with 0
        as_prefill = AttentionBatch(
            slot_mapping=batch.slot_mapping,
            decode_block_tables=[],
            decode_seq_lens=[],
            prefill_block_tables=batch.decode_block_tables + batch.prefill_block_tables,
            prefill_query_starts=list(range(decoding)) + [decoding + start for start in batch.prefill_query_starts],
            prefill_seq_lens=batch.decode_seq_lens + batch.prefill_seq_lens,
        )
        return super().prepare(as_prefill)


class TritonAttention(AttentionBackend):
    name = "triton"

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        if device.type != "cuda":
            # Off the GPU, Triton runs only in its interpreter, which must be on before any kernel is defined.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from kernels import cache_ops, paged_attention

        self._cache_ops, self._kernels = cache_ops, paged_attention

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
    ) -> None:
        self._cache_ops.store_kv(k, v, k_cache, v_cache, slots)

    def decode(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        return self._kernels.paged_decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale, window=window
        )

    def prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        meta: AttentionMetadata, scale: float, window: int | None = None,
    ) -> torch.Tensor:
        return self._kernels.paged_prefill_attention(
            q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q, meta.prefill_seq_lens, scale,
            max_query_len=meta.prefill_max_query_len, window=window,
        )


@dataclass(frozen=True)
class LayerOps:
    """RMSNorm, the residual add fused with the next norm, RoPE, SiLU(gate) * up, and greedy decoding's pick of
    each row's first highest logit; the signatures of ``kernels.reference``."""

    name: str
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    greedy_tokens: Callable[[torch.Tensor], torch.Tensor]


def backend_name(device: torch.device) -> str:
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, not {chosen!r}")
    return chosen or ("triton" if device.type == "cuda" else "cpu")


def _compiled_cpu_kernels(device: torch.device) -> ModuleType | None:
    if device.type != "cpu" or backend_name(device) != "cpu":
        return None
    from kernels import cpu

    return cpu.load()


def select_attention_backend(device: torch.device, batch_invariant: bool = False) -> AttentionBackend:
    """``batch_invariant``: the compiled CPU kernels' batch-invariant use; raises ValueError where they are not."""
    if batch_invariant:
        compiled = _compiled_cpu_kernels(device)
        if compiled is None:
            raise ValueError(f"batch-invariant mode needs the compiled CPU kernels; the {backend_name(device)} "
                             "attention backend serves here")
        return BatchInvariantCpuAttention(device, compiled)
    if backend_name(device) == "triton":
        return TritonAttention(device)
    compiled = _compiled_cpu_kernels(device)
    return CpuAttention(device, compiled) if compiled is not None else TorchAttention(device)


def select_layer_ops(device: torch.device) -> LayerOps:
    compiled = _compiled_cpu_kernels(device)
    if compiled is None:
        return LayerOps("torch", reference.rms_norm, reference.add_rms_norm, reference.rotary, reference.silu_mul,
                        reference.greedy_tokens)

    def add_rms_norm(hidden, delta, weight, eps):
        return hidden, compiled.add_rms_norm_(hidden, delta, weight, eps)

    def rotary(positions, q, k, cos, sin):
        compiled.rotary_(q, k, positions, cos, sin)
        return q, k

    return LayerOps("cpu", compiled.rms_norm, add_rms_norm, rotary, compiled.silu_mul, compiled.greedy_tokens)
