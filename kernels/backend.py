"""The one dispatch point between the Triton kernels and their torch twins."""

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

BACKEND_ENV = "VIGIL_ATTENTION_BACKEND"


@dataclass(frozen=True)
class AttentionOps:
    name: str
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    store_kv: Callable[..., None]


def backend_name(device: torch.device) -> str:
    """``triton`` for CUDA devices, ``torch`` elsewhere, unless VIGIL_ATTENTION_BACKEND says otherwise."""
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen and chosen not in ("torch", "triton"):
        raise ValueError(f"{BACKEND_ENV} must be 'torch' or 'triton', not {chosen!r}")
    return chosen or ("triton" if device.type == "cuda" else "torch")


def select_attention_ops(device: torch.device) -> AttentionOps:
    if backend_name(device) == "torch":
        from kernels import reference

        return AttentionOps(
            "torch", reference.paged_decode_attention, reference.paged_prefill_attention, reference.store_kv
        )
    if device.type != "cuda":
        # Off the GPU, Triton runs only in its interpreter, which must be on before any kernel is defined.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from kernels import cache_ops, paged_attention

    return AttentionOps(
        "triton", paged_attention.paged_decode_attention, paged_attention.paged_prefill_attention,
        cache_ops.store_kv,
    )
