"""Every decoder layer of a step (decoding rows, prompt chunks or both) in one C++ call
(kernels/csrc/decode_layers.h), for plain llama-style
layers over bf16 weights (packed for AMX tiles, or plain for the few-rows kernel and oneDNN), over fp16 weights
packed for fbgemm under fp32 compute, or over int8 or int4 weights that the C++ quantised kernels multiply, with
the CPU kernels running attention and the layer ops. Between its kernels
``DecoderModel.forward`` spends Python's time on each layer: about 7 ms of a 48-65 ms decode step at batch 64 on
two Xeon cores, 3 of 18 ms at one stream in fp32, and 3-5 ms of a 16- to 128-token prompt's 15-37 ms in bf16 on
AMX. The C++ loop calls the same kernels in the same order on the same tensors, so its result is the same bits. The
execution plan (server/engine/execution_plan.py) decides whether a model's steps take it."""

from typing import Any

import torch

from kernels.backend import AttentionMetadata, CpuAttention
from server.models.config import ModelConfig
from server.models.decoder import DecoderLayer, DecoderModel
from server.models.linear import (
    AmxBf16WeightLinear,
    Bf16WeightLinear,
    DenseLinear,
    Fp16WeightLinear,
    QuantizedLinear,
    RowInvariantAmxBf16Linear,
    RowInvariantBf16Linear,
    silu_mul_fuses_into,
)

# bf16 layers the compiled loop multiplies as they do (batch-invariant mode's included); not torch's DenseLinear.
BF16_LINEARS = (AmxBf16WeightLinear, Bf16WeightLinear, RowInvariantAmxBf16Linear, RowInvariantBf16Linear)


class OneCallDecode:
    """A step's layers: its decoding rows first, then its prompt chunks, as the attention metadata lists them."""

    def __init__(self, model: DecoderModel, compiled_layers: Any) -> None:
        self._model = model
        self._layers = compiled_layers

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """The last layer's output after the final norm, as ``DecoderModel.forward`` returns it (the layers'
        residual adds update the embeddings and their first norm in place)."""
        hidden, normed = self._model.embed_input(input_ids)
        return self._layers.forward(
            hidden, normed, positions, [k for k, _ in kv_caches], [v for _, v in kv_caches], meta.slot_mapping,
            meta.decode_block_tables, meta.decode_seq_lens, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
            meta.prefill_seq_lens, self._model.attention.prompt_on_tiles(meta),
        )


def one_call_refusal(model: DecoderModel) -> str | None:
    """Why ``model``'s steps cannot take the one-call loop, or None where they can: a layer that needs what
    only the Python loop does (biases, QK-norm, output norms, GeGLU, weights other than bf16, fbgemm's fp16
    or C++-quantised ones), or another attention backend. In batch-invariant mode the compiled loop calls that
    mode's kernels."""
    attention, config = model.attention, model.config
    if not isinstance(attention, CpuAttention):
        return f"the {attention.name} attention backend (the compiled loop runs the CPU kernels' attention)"
    if model.layer_ops.name != "cpu":
        return f"the {model.layer_ops.name} layer ops (the compiled loop runs the CPU kernels' layer ops)"
    if config.hidden_act != "silu":
        return f"the {config.hidden_act} activation (the compiled loop has SwiGLU only)"
    for index, layer in enumerate(model.layers):
        refusal = _layer_refusal(layer, config)
        if refusal:
            return f"layer {index}: {refusal}"
    return None if model.layers else "no layers"


def build_one_call_decode(model: DecoderModel) -> OneCallDecode:
    """The compiled loop over ``model``'s layers, which ``one_call_refusal`` has accepted."""
    config, layers = model.config, model.layers
    compiled = model.attention.compiled.DecodeLayers(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.hidden_size,
        config.intermediate_size, config.rms_norm_eps, config.attention_scale, model.attention.batch_invariant,
    )
    next_norms = [layer.input_norm for layer in layers[1:]] + [model.norm]
    for layer, next_norm, table, window in zip(layers, next_norms, model.rotary, config.layer_windows, strict=True):
        attn, mlp = layer.attention, layer.mlp
        if isinstance(attn.qkv, QuantizedLinear):
            add = compiled.add_quantized_layer
        else:
            add = compiled.add_fp16_layer if isinstance(attn.qkv, Fp16WeightLinear) else compiled.add_layer
        add(
            _weight(attn.qkv), _weight(attn.o_proj), _weight(mlp.gate_up), _weight(mlp.down), layer.mlp_norm,
            next_norm, table.cos, table.sin, window or 0,
        )
    return OneCallDecode(model, compiled)


OneCallLinear = AmxBf16WeightLinear | DenseLinear | Fp16WeightLinear | QuantizedLinear


def _weight(linear: OneCallLinear) -> Any:
    """What the compiled loop multiplies by: the tile layout, the plain [out, in] matrix, fbgemm's packing, or the
    quantised codes and their scales (and minimums)."""
    if isinstance(linear, QuantizedLinear):
        return list(linear.weight.tensors)
    return linear.weight if isinstance(linear, DenseLinear) else linear.packed


def _out_features(linear: OneCallLinear) -> int:
    if isinstance(linear, QuantizedLinear):
        return linear.weight.data.shape[0]
    return linear.weight.shape[0] if isinstance(linear, DenseLinear) else linear.out_features


def _compiled_quantized(linear: object) -> bool:
    """A quantised layer the C++ kernels multiply (the compiled loop calls the same ones)."""
    return isinstance(linear, QuantizedLinear) and linear.kernel_name.endswith("-cpp")


def _layer_refusal(layer: DecoderLayer, config: ModelConfig) -> str | None:
    """None for a llama-style layer whose four linears are bf16, all four fbgemm's fp16, or all four quantised by
    one method and multiplied by the C++ kernels, at the sizes
    ``config`` gives, with SwiGLU inside the gate/up kernel wherever the decoder puts it there."""
    attn, mlp = layer.attention, layer.mlp
    linears = (attn.qkv, attn.o_proj, mlp.gate_up, mlp.down)
    bf16 = all(type(linear) in BF16_LINEARS for linear in linears)
    quantized = all(_compiled_quantized(linear) for linear in linears)
    if quantized and len({linear.kernel_name for linear in linears}) > 1:
        return "layers quantised by more than one method"
    if not bf16 and not quantized and not all(type(linear) is Fp16WeightLinear for linear in linears):
        kernels = sorted({linear.kernel_name for linear in linears})
        return f"weights the compiled loop does not take ({', '.join(kernels)})"
    if isinstance(mlp.gate_up, AmxBf16WeightLinear) and not silu_mul_fuses_into(mlp.gate_up):
        return "a gate/up layer whose halves SwiGLU cannot fuse into"
    extras = (attn.qkv_bias, attn.q_norm, attn.k_norm, attn.output_norm, mlp.output_norm)
    if any(extra is not None for extra in extras):
        return "Q/K/V biases, QK-norm or output norms"
    heads = config.num_attention_heads + 2 * config.num_key_value_heads
    sizes_fit = (
        _out_features(attn.qkv) == heads * config.head_dim
        and _out_features(attn.o_proj) == _out_features(mlp.down) == config.hidden_size
        and _out_features(mlp.gate_up) == 2 * config.intermediate_size
    )
    return None if sizes_fit else "layer sizes other than the config's"
