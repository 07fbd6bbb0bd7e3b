"""The Llama-family forward pass over a paged KV cache, on flattened tokens of many sequences."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.backend import AttentionOps
from server.models.config import ModelConfig


@dataclass
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to.

    Rows ``[:num_decode_tokens]`` are single-token steps (one per sequence, decode kernel); the rest are
    chunks of several tokens (prefill kernel).
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_seq_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_cu_seqlens_q: torch.Tensor
    prefill_seq_lens: torch.Tensor


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """As Hugging Face computes it: normalise in fp32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding:
    def __init__(self, head_dim: int, theta: float, max_positions: int, device: torch.device) -> None:
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(device)
        self.sin = angles.sin().to(device)

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cos = self.cos[positions].to(q.dtype)[:, None, :]
        sin = self.sin[positions].to(q.dtype)[:, None, :]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaModel:
    """Weights as plain tensors; Q/K/V and gate/up are fused so that each layer runs four GEMMs."""

    def __init__(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], ops: AttentionOps, device: torch.device
    ) -> None:
        self.config = config
        self.ops = ops
        self.scale = config.head_dim**-0.5
        self.embed_tokens = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        self.lm_head = weights.get("lm_head.weight", self.embed_tokens)
        self.layers = [self._layer_weights(weights, i) for i in range(config.num_hidden_layers)]
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings, device)

    @staticmethod
    def _layer_weights(weights: dict[str, torch.Tensor], index: int) -> LayerWeights:
        prefix = f"model.layers.{index}."
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        return LayerWeights(
            input_norm=weights[prefix + "input_layernorm.weight"],
            qkv=torch.cat([weights[attn + f"{n}_proj.weight"] for n in "qkv"]),
            o_proj=weights[attn + "o_proj.weight"],
            post_attention_norm=weights[prefix + "post_attention_layernorm.weight"],
            gate_up=torch.cat([weights[mlp + "gate_proj.weight"], weights[mlp + "up_proj.weight"]]),
            down=weights[mlp + "down_proj.weight"],
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
        hidden = F.embedding(input_ids, self.embed_tokens)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            normed = rms_norm(hidden, layer.input_norm, self.config.rms_norm_eps)
            attended = self._attention(layer, normed, positions, k_cache, v_cache, meta)
            hidden = hidden + F.linear(attended, layer.o_proj)
            normed = rms_norm(hidden, layer.post_attention_norm, self.config.rms_norm_eps)
            gate, up = F.linear(normed, layer.gate_up).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down)
        return rms_norm(hidden, self.norm, self.config.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head)

    def _attention(
        self,
        layer: LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        cfg = self.config
        num_tokens = x.shape[0]
        q_size = cfg.num_attention_heads * cfg.head_dim
        kv_size = cfg.num_key_value_heads * cfg.head_dim
        q, k, v = F.linear(x, layer.qkv).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(num_tokens, cfg.num_attention_heads, cfg.head_dim)
        k = k.view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        v = v.view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        q, k = self.rotary(positions, q, k)
        self.ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        num_decode = meta.num_decode_tokens
        if num_decode == num_tokens:
            out = self.ops.paged_decode_attention(
                q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale
            )
        else:
            out = torch.empty_like(q)
            if num_decode:
                out[:num_decode] = self.ops.paged_decode_attention(
                    q[:num_decode], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, self.scale
                )
            out[num_decode:] = self.ops.paged_prefill_attention(
                q[num_decode:], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                meta.prefill_seq_lens, self.scale,
            )
        return out.reshape(num_tokens, q_size)
