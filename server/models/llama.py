"""The Llama-family forward pass over a paged KV cache, on flattened tokens of many sequences."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.backend import AttentionBackend, AttentionMetadata, LayerOps
from server.models.config import ModelConfig
from server.models.linear import Linear, make_linear


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear
    o_proj: Linear
    post_attention_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class RotaryEmbedding:
    """cos and sin of every position's angles, fp32 ``[max_positions, head_dim]``, halves repeated."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(device)
        self.sin = angles.sin().to(device)


class LlamaModel:
    """Norms as plain tensors and weight matrices as ``Linear``s in ``weight_dtype``; Q/K/V and gate/up are
    fused so that each layer runs four GEMMs. Every weight matrix, the embedding table included, is held in
    ``weight_dtype``; everything else computes in the dtype of ``weights``."""

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        attention: AttentionBackend,
        layer_ops: LayerOps,
        device: torch.device,
        weight_dtype: torch.dtype,
        quantization: str | None = None,
    ) -> None:
        self.config = config
        self.attention = attention
        self.layer_ops = layer_ops
        self.scale = config.head_dim**-0.5
        embed_tokens = weights["model.embed_tokens.weight"]
        self.dtype = embed_tokens.dtype
        self.weight_dtype = weight_dtype
        self.embed_tokens = embed_tokens.to(weight_dtype)
        self.norm = weights["model.norm.weight"]
        self.quantization = quantization
        self.lm_head = make_linear(weights.get("lm_head.weight", embed_tokens), weight_dtype, quantization)
        self.layers = [self._layer_weights(weights, i, weight_dtype, quantization)
                       for i in range(config.num_hidden_layers)]
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings, device)

    @staticmethod
    def _layer_weights(
        weights: dict[str, torch.Tensor], index: int, weight_dtype: torch.dtype, quantization: str | None
    ) -> LayerWeights:
        prefix = f"model.layers.{index}."
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        return LayerWeights(
            input_norm=weights[prefix + "input_layernorm.weight"],
            qkv=make_linear(
                torch.cat([weights[attn + f"{n}_proj.weight"] for n in "qkv"]), weight_dtype, quantization
            ),
            o_proj=make_linear(weights[attn + "o_proj.weight"], weight_dtype, quantization),
            post_attention_norm=weights[prefix + "post_attention_layernorm.weight"],
            gate_up=make_linear(
                torch.cat([weights[mlp + "gate_proj.weight"], weights[mlp + "up_proj.weight"]]), weight_dtype,
                quantization,
            ),
            down=make_linear(weights[mlp + "down_proj.weight"], weight_dtype, quantization),
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states after the final norm, one row per input token."""
        hidden = F.embedding(input_ids, self.embed_tokens).to(self.dtype)
        ops, eps = self.layer_ops, self.config.rms_norm_eps
        next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.norm]
        normed = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        for layer, next_norm, kv_cache in zip(self.layers, next_norms, kv_caches, strict=True):
            attended = self._attention(layer, normed, positions, kv_cache, meta)
            hidden, normed = ops.add_rms_norm(hidden, layer.o_proj(attended), layer.post_attention_norm, eps)
            mlp_out = layer.down(ops.silu_mul(layer.gate_up(normed)))
            hidden, normed = ops.add_rms_norm(hidden, mlp_out, next_norm, eps)
        return normed

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    @property
    def weight_bytes(self) -> int:
        """What the model keeps of its weights: the matrices as stored (quantised, fp16, ...), the embedding
        table and the norms."""
        matrices = [self.lm_head] + [m for layer in self.layers for m in (layer.qkv, layer.o_proj, layer.gate_up,
                                                                           layer.down)]
        norms = [self.norm] + [n for layer in self.layers for n in (layer.input_norm, layer.post_attention_norm)]
        return self.embed_tokens.nbytes + sum(m.nbytes for m in matrices) + sum(n.nbytes for n in norms)

    def _attention(
        self,
        layer: LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cfg = self.config
        num_tokens = x.shape[0]
        q_size = cfg.num_attention_heads * cfg.head_dim
        kv_size = cfg.num_key_value_heads * cfg.head_dim
        q, k, v = layer.qkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, cfg.num_attention_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        v = v.view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        q, k = self.layer_ops.rotary(positions, q, k, self.rotary.cos, self.rotary.sin)
        return self.attention.forward(q, k, v, kv_cache, meta, self.scale).reshape(num_tokens, q_size)
