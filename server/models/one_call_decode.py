"""Every decoder layer of a decode step in one C++ call (kernels/csrc/decode_layers.h), for plain llama-style
layers over bf16 weights (packed for AMX tiles, or plain for the few-rows kernel and oneDNN), or over fp16 weights
packed for fbgemm under fp32 compute, with the CPU kernels running attention and the layer ops. Between its kernels
``DecoderModel.forward`` spends Python's time on each layer: about 7 ms of a 48-65 ms decode step at batch 64 on
two Xeon cores, and 3 of 18 ms at one stream in fp32. The C++ loop calls the same kernels in the same order on the
same tensors, so its result is the same bits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kernels.backend import AttentionBackend, AttentionMetadata, CpuAttention, LayerOps
from server.models.config import ModelConfig
from server.models.layers import RotaryEmbedding
from server.models.linear import AmxBf16WeightLinear, Bf16WeightLinear, Fp16WeightLinear, silu_mul_fuses_into

if TYPE_CHECKING:
    from server.models.decoder import DecoderLayer


class OneCallDecode:
    """A decode step's layers: the rows are one query token each, all decoding."""

    def __init__(self, compiled_layers: Any) -> None:
        self._layers = compiled_layers

    def __call__(
        self,
        hidden: torch.Tensor,
        normed: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The last layer's output after the final norm, as ``DecoderModel.forward`` returns it; ``normed`` is the
        first layer's input norm of ``hidden``, which the layers' residual adds update in place."""
        return self._layers.forward(
            hidden, normed, positions, [k for k, _ in kv_caches], [v for _, v in kv_caches], meta.slot_mapping,
            meta.decode_block_tables, meta.decode_seq_lens,
        )


def one_call_decode(
    config: ModelConfig,
    layers: Sequence[DecoderLayer],
    final_norm: torch.Tensor,
    rotary: Sequence[RotaryEmbedding],
    attention: AttentionBackend,
    layer_ops: LayerOps,
) -> OneCallDecode | None:
    """The one-call loop over ``layers``, or None where a layer needs what only the Python loop does (biases,
    QK-norm, output norms, GeGLU, weights other than bf16 or fbgemm's fp16 ones, another attention backend, the
    batch-invariant one included). A tensor-parallel rank's layers pass these checks (its config is its share);
    ``parallelize`` drops the loop when it wraps them for the all-reduce, which the loop does not do."""
    if not isinstance(attention, CpuAttention) or attention.batch_invariant:
        return None
    if layer_ops.name != "cpu" or config.hidden_act != "silu":
        return None
    if not layers or not all(_plain(layer, config) for layer in layers):
        return None
    compiled = attention.compiled.DecodeLayers(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.hidden_size,
        config.intermediate_size, config.rms_norm_eps, config.attention_scale,
    )
    next_norms = [layer.input_norm for layer in layers[1:]] + [final_norm]
    for layer, next_norm, table, window in zip(layers, next_norms, rotary, config.layer_windows, strict=True):
        attn, mlp = layer.attention, layer.mlp
        add = compiled.add_fp16_layer if isinstance(attn.qkv, Fp16WeightLinear) else compiled.add_layer
        add(
            _weight(attn.qkv), _weight(attn.o_proj), _weight(mlp.gate_up), _weight(mlp.down), layer.mlp_norm,
            next_norm, table.cos, table.sin, window or 0,
        )
    return OneCallDecode(compiled)


OneCallLinear = AmxBf16WeightLinear | Bf16WeightLinear | Fp16WeightLinear


def _weight(linear: OneCallLinear) -> Any:
    """What the compiled loop multiplies by: the tile layout, the plain [out, in] matrix, or fbgemm's packing."""
    return linear.weight if isinstance(linear, Bf16WeightLinear) else linear.packed


def _out_features(linear: OneCallLinear) -> int:
    return linear.weight.shape[0] if isinstance(linear, Bf16WeightLinear) else linear.out_features


def _plain(layer: DecoderLayer, config: ModelConfig) -> bool:
    """A llama-style layer whose four linears are bf16, or all four fbgemm's fp16, at the sizes ``config`` gives,
    with SwiGLU inside the gate/up kernel wherever the decoder puts it there."""
    attn, mlp = layer.attention, layer.mlp
    linears = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
    bf16 = all(type(linear) in (AmxBf16WeightLinear, Bf16WeightLinear) for linear in linears)
    if not bf16 and not all(type(linear) is Fp16WeightLinear for linear in linears):
        return False
    if isinstance(mlp.gate_up, AmxBf16WeightLinear) and not silu_mul_fuses_into(mlp.gate_up):
        return False
    extras = (attn.qkv_bias, attn.q_norm, attn.k_norm, attn.output_norm, mlp.output_norm)
    heads = config.num_attention_heads + 2 * config.num_key_value_heads
    return (
        all(extra is None for extra in extras)
        and _out_features(attn.qkv) == heads * config.head_dim
        and _out_features(attn.o_proj) == _out_features(mlp.down) == config.hidden_size
        and _out_features(mlp.gate_up) == 2 * config.intermediate_size
    )
