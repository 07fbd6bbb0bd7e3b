"""The decoder-only forward pass over a paged KV cache, on flattened tokens of many sequences, for every family.

A family (``llama.py``, ``qwen.py``, ``gemma3.py``, ``phi3.py``) only reads its checkpoint into ``DecoderWeights``;
what it has beyond Llama is optional there: Q/K/V biases, QK-norm, norms after attention and after the MLP, a
scaled embedding. Per layer, the config gives the sliding window and the RoPE base.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.backend import AttentionBackend, AttentionMetadata, LayerOps
from server.models.config import ModelConfig
from server.models.layers import GatedActivation, LinearFactory, TokenEmbedding, Weights, rotary_tables
from server.models.linear import Linear, SiluMulOfGateUp, silu_mul_fuses_into


@dataclass
class AttentionWeights:
    qkv: Linear  # Q, K and V stacked
    o_proj: Linear
    qkv_bias: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # RMSNorm over each head's dims (QK-norm)
    k_norm: torch.Tensor | None = None
    output_norm: torch.Tensor | None = None  # of the attention's output, before the residual add


@dataclass
class MLPWeights:
    gate_up: Linear  # gate and up stacked
    down: Linear
    output_norm: torch.Tensor | None = None


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    attention: AttentionWeights
    mlp_norm: torch.Tensor
    mlp: MLPWeights


@dataclass
class DecoderWeights:
    embed_tokens: torch.Tensor
    layers: list[DecoderLayer]
    norm: torch.Tensor
    lm_head: Linear
    embed_scale: float | None = None  # Gemma multiplies the embeddings by sqrt(hidden_size)


def read_decoder(
    config: ModelConfig,
    weights: Weights,
    linear: LinearFactory,
    read_layer: Callable[[str], DecoderLayer],
    final_norm: torch.Tensor | None = None,
    embed_scale: float | None = None,
) -> DecoderWeights:
    """What every family reads the same way around its blocks: the embedding table, the blocks (``read_layer`` of
    each ``model.layers.N.`` prefix), the final norm and the output layer (the embedding table where tied)."""
    embed_tokens = weights["model.embed_tokens.weight"]
    return DecoderWeights(
        embed_tokens=embed_tokens,
        layers=[read_layer(f"model.layers.{i}.") for i in range(config.num_hidden_layers)],
        norm=weights["model.norm.weight"] if final_norm is None else final_norm,
        lm_head=linear(weights.get("lm_head.weight", embed_tokens)),
        embed_scale=embed_scale,
    )


class DecoderModel:
    """Norms as plain tensors and weight matrices as ``Linear``s; Q/K/V and gate/up are fused so that each layer
    runs four GEMMs. The embedding table is held in ``weight_dtype``; everything else computes in the dtype of
    the embedding table as loaded."""

    # One process: no ranks to time (server/models/interface.py).
    rank_step_durations_s: tuple[float, ...] = ()

    def __init__(
        self,
        config: ModelConfig,
        weights: DecoderWeights,
        activation: GatedActivation,
        attention: AttentionBackend,
        layer_ops: LayerOps,
        device: torch.device,
        weight_dtype: torch.dtype,
    ) -> None:
        self.config = config
        self.attention = attention
        self.layer_ops = layer_ops
        self.activation = activation
        self.dtype = weights.embed_tokens.dtype
        self.weight_dtype = weight_dtype
        self.embed = TokenEmbedding(weights.embed_tokens.to(weight_dtype), self.dtype)
        # As transformers does it: the scale rounded to the compute dtype, then multiplied.
        self.embed_scale = (
            torch.tensor(weights.embed_scale, dtype=self.dtype, device=device) if weights.embed_scale else None
        )
        self.layers = weights.layers
        self.norm = weights.norm
        self.lm_head = weights.lm_head
        self.rotary = rotary_tables(config.layer_rope_thetas, config.head_dim, config.max_position_embeddings, device)
        self.activated_gate_ups = [self._activated(layer.mlp.gate_up) for layer in self.layers]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the final norm, one row per input token: the Python loop over the layers (the
        execution plan may run a step's layers in one compiled call instead: one_call_decode.py)."""
        hidden, normed = self.embed_input(input_ids)
        ops, eps = self.layer_ops, self.config.rms_norm_eps
        next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        layers = zip(self.layers, next_norms, kv_caches, self.activated_gate_ups, strict=True)
        for index, (layer, next_norm, kv_cache, activated_gate_up) in enumerate(layers):
            attn, mlp = layer.attention, layer.mlp
            attended = attn.o_proj(self._attention(index, attn, normed, positions, kv_cache, meta))
            if attn.output_norm is not None:
                attended = ops.rms_norm(attended, attn.output_norm, eps)
            hidden, normed = ops.add_rms_norm(hidden, attended, layer.mlp_norm, eps)
            mlp_out = mlp.down(activated_gate_up(normed))
            if mlp.output_norm is not None:
                mlp_out = ops.rms_norm(mlp_out, mlp.output_norm, eps)
            hidden, normed = ops.add_rms_norm(hidden, mlp_out, next_norm, eps)
        return normed

    def embed_input(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens' embeddings (the residual stream) and their first layer's input norm."""
        hidden = self.embed(input_ids)
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        return hidden, self.layer_ops.rms_norm(hidden, self.layers[0].input_norm, self.config.rms_norm_eps)

    def _activated(self, gate_up: Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        """The activation of gate_up's output. SwiGLU runs inside the layer's AMX kernel where the activation is
        the compiled layer op, whose arithmetic that kernel shares."""
        if self.config.hidden_act == "silu" and self.layer_ops.name == "cpu" and silu_mul_fuses_into(gate_up):
            return SiluMulOfGateUp(gate_up, self.activation)
        return lambda x: self.activation(gate_up(x))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def linear_kernels(self) -> dict[str, str]:
        first = self.layers[0]
        gate_up = first.mlp.gate_up.kernel_name
        if isinstance(self.activated_gate_ups[0], SiluMulOfGateUp):
            gate_up += "+swiglu"
        return {"qkv": first.attention.qkv.kernel_name, "o_proj": first.attention.o_proj.kernel_name,
                "gate_up": gate_up, "down": first.mlp.down.kernel_name, "lm_head": self.lm_head.kernel_name}

    @property
    def weight_bytes(self) -> int:
        """What the model keeps of its weights: the matrices as stored (quantised, fp16, ...), the embedding
        table, the norms and biases."""
        matrices, vectors = [self.lm_head], [self.norm]
        for layer in self.layers:
            attn, mlp = layer.attention, layer.mlp
            matrices += [attn.qkv, attn.o_proj, mlp.gate_up, mlp.down]
            vectors += [layer.input_norm, layer.mlp_norm, attn.qkv_bias, attn.q_norm, attn.k_norm, attn.output_norm,
                        mlp.output_norm]
        vector_bytes = sum(v.nbytes for v in vectors if v is not None)
        return self.embed.nbytes + sum(m.nbytes for m in matrices) + vector_bytes

    def _attention(
        self,
        index: int,
        attn: AttentionWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cfg, ops = self.config, self.layer_ops
        num_tokens, head_dim = x.shape[0], cfg.head_dim
        q_size = cfg.num_attention_heads * head_dim
        kv_size = cfg.num_key_value_heads * head_dim
        qkv = attn.qkv(x)
        if attn.qkv_bias is not None:
            qkv += attn.qkv_bias
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        if attn.q_norm is not None:
            q = ops.rms_norm(q.reshape(-1, head_dim), attn.q_norm, cfg.rms_norm_eps)
            k = ops.rms_norm(k.reshape(-1, head_dim), attn.k_norm, cfg.rms_norm_eps)
        q = q.view(num_tokens, cfg.num_attention_heads, head_dim)
        k = k.view(num_tokens, cfg.num_key_value_heads, head_dim)
        v = v.view(num_tokens, cfg.num_key_value_heads, head_dim)
        rotary = self.rotary[index]
        q, k = ops.rotary(positions, q, k, rotary.cos, rotary.sin)
        out = self.attention.forward(q, k, v, kv_cache, meta, cfg.attention_scale, cfg.layer_windows[index])
        return out.reshape(num_tokens, q_size)
