"""The floating-point work of a step, counted from the model's shape: the numerator of model FLOPs utilisation.

Counted as 2 FLOPs per multiply-add, as in the PaLM paper's MFU: the weight matrices for every token, the
output layer for the tokens that are sampled, and attention (Q·K and weights·V) for every query against the
keys it sees. Norms, RoPE and activations are left out: they are a fraction of a percent.
"""

from dataclasses import dataclass

from server.engine.scheduler import SchedulerOutput
from server.models.config import ModelConfig


@dataclass(frozen=True)
class ModelFlops:
    per_token: int
    per_sampled_token: int
    per_attended_key: int

    @classmethod
    def of(cls, config: ModelConfig) -> "ModelFlops":
        hidden, heads, kv_heads, head_dim = (
            config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        )
        attention_weights = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
        mlp_weights = 3 * hidden * config.intermediate_size
        return cls(
            per_token=2 * config.num_hidden_layers * (attention_weights + mlp_weights),
            per_sampled_token=2 * hidden * config.vocab_size,
            per_attended_key=2 * 2 * config.num_hidden_layers * heads * head_dim,
        )

    def of_step(self, scheduled: SchedulerOutput) -> int:
        total = 0
        for item in scheduled.scheduled:
            new, start = item.num_new_tokens, item.start
            # Query i of the chunk (0-based) sees start + i + 1 keys.
            attended_keys = new * start + new * (new + 1) // 2
            total += new * self.per_token + attended_keys * self.per_attended_key
            if item.samples:
                total += self.per_sampled_token
        return total
