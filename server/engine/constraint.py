"""What the engine needs of a structured-output grammar: which tokens may come next, and the token that came.

The API layer implements it over a grammar library; the engine knows only this shape.
"""

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the API schema imports this module's neighbours, and must not load torch
    import torch


class TokenConstraint(Protocol):
    def fill_bitmask(self, bitmask: "torch.Tensor") -> None:
        """Write the allowed next tokens into ``bitmask``, one contiguous int32 row of ceil(vocab / 32) words:
        bit ``t % 32`` of word ``t // 32`` set means token ``t`` is allowed."""

    def accept_token(self, token_id: int) -> None:
        """Advance past the token that was sampled."""

    def is_finished(self) -> bool:
        """Nothing but end-of-sequence may follow (the grammar is complete, or it failed)."""
