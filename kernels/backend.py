"""The one dispatch point between the kernel implementations: attention, and a layer's elementwise ops.

- ``triton``: the Triton kernels; the default for CUDA tensors.
- ``cpu``: the compiled C++ kernels (decode and prefill attention, the KV store, the elementwise ops); the
  default elsewhere, falling back to ``torch`` where no C++ compiler is available.
- ``torch``: ``kernels.reference`` alone, the oracle.

``VIGIL_ATTENTION_BACKEND=torch|triton|cpu`` overrides the choice.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

BACKEND_ENV = "VIGIL_ATTENTION_BACKEND"
BACKENDS = ("torch", "triton", "cpu")


@dataclass(frozen=True)
class AttentionOps:
    name: str
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    store_kv: Callable[..., None]


@dataclass(frozen=True)
class LayerOps:
    """RMSNorm, the residual add fused with the next norm, RoPE and SiLU(gate) * up; the signatures of
    ``kernels.reference``."""

    name: str
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]


def backend_name(device: torch.device) -> str:
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, not {chosen!r}")
    return chosen or ("triton" if device.type == "cuda" else "cpu")


def select_attention_ops(device: torch.device) -> AttentionOps:
    name = backend_name(device)
    if name == "triton":
        return _triton_ops(device)
    from kernels import reference

    compiled = None
    if name == "cpu":
        from kernels import cpu

        compiled = cpu.load()
    if compiled is None:
        return AttentionOps(
            "torch", reference.paged_decode_attention, reference.paged_prefill_attention, reference.store_kv
        )
    return AttentionOps("cpu", compiled.paged_decode_attention, compiled.paged_prefill_attention, compiled.store_kv)


def select_layer_ops(device: torch.device) -> LayerOps:
    from kernels import reference

    compiled = None
    if device.type == "cpu" and backend_name(device) == "cpu":
        from kernels import cpu

        compiled = cpu.load()
    if compiled is None:
        return LayerOps("torch", reference.rms_norm, reference.add_rms_norm, reference.rotary, reference.silu_mul)

    def add_rms_norm(hidden, delta, weight, eps):
        return hidden, compiled.add_rms_norm_(hidden, delta, weight, eps)

    def rotary(positions, q, k, cos, sin):
        compiled.rotary_(q, k, positions, cos, sin)
        return q, k

    return LayerOps("cpu", compiled.rms_norm, add_rms_norm, rotary, compiled.silu_mul)


def _triton_ops(device: torch.device) -> AttentionOps:
    if device.type != "cuda":
        # Off the GPU, Triton runs only in its interpreter, which must be on before any kernel is defined.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from kernels import cache_ops, paged_attention

    return AttentionOps(
        "triton", paged_attention.paged_decode_attention, paged_attention.paged_prefill_attention,
        cache_ops.store_kv,
    )
