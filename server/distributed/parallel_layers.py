"""The layers that talk across ranks, wrapped around a rank's ``DecoderModel`` built from its shard
(sharding.py): the output projection and down projection add their partial sums, the embedding adds its ranks'
rows, and the output layer gathers the ranks' slices of the vocabulary."""

import torch

from server.distributed.group import TensorParallelGroup
from server.models.decoder import DecoderModel
from server.models.layers import TokenEmbedding
from server.models.linear import Linear


class RowParallelLinear:
    """A Linear over this rank's slice of the input features: its product is a partial sum of the whole layer's."""

    def __init__(self, local: Linear, group: TensorParallelGroup) -> None:
        self.local = local
        self.group = group
        self.nbytes = local.nbytes
        self.kernel_name = f"{local.kernel_name}+all-reduce"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(self.local(x))


class VocabParallelEmbedding:
    """This rank's rows of the embedding table; a token outside them looks up zeros, and the ranks' rows add up
    to the one that holds it."""

    def __init__(self, local: TokenEmbedding, group: TensorParallelGroup) -> None:
        self.local = local
        self.group = group
        self.first_id = group.rank * local.table.shape[0]
        self.nbytes = local.nbytes

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids - self.first_id
        outside = (ids < 0) | (ids >= self.local.table.shape[0])
        rows = self.local(ids.masked_fill(outside, 0))
        return self.group.all_reduce(rows.masked_fill_(outside[:, None], 0.0))


class GatheredOutput:
    """The output layer over this rank's rows of the vocabulary; every rank gets the whole vocabulary's logits."""

    def __init__(self, local: Linear, group: TensorParallelGroup, vocab_size: int) -> None:
        self.local = local
        self.group = group
        self.vocab_size = vocab_size
        self.nbytes = local.nbytes
        self.kernel_name = f"{local.kernel_name}+all-gather"

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.cat(self.group.all_gather(self.local(hidden)), dim=-1)
        return logits if logits.shape[-1] == self.vocab_size else logits[:, : self.vocab_size].contiguous()


def parallelize(model: DecoderModel, group: TensorParallelGroup, vocab_size: int) -> DecoderModel:
    """``model``, built from rank ``group.rank``'s shard, with the layers that combine the ranks' results."""
    model.embed = VocabParallelEmbedding(model.embed, group)
    for layer in model.layers:
        layer.attention.o_proj = RowParallelLinear(layer.attention.o_proj, group)
        layer.mlp.down = RowParallelLinear(layer.mlp.down, group)
    model.lm_head = GatheredOutput(model.lm_head, group, vocab_size)
    return model
