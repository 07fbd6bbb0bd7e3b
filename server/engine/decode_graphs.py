"""CUDA graphs of the decode step: the model's forward over a fixed number of one-token rows, captured once per
batch size when the engine starts and replayed, so that a decode step is one launch instead of the hundreds of
kernel launches the Python layer loop makes. A step of ``n`` sequences replays the smallest captured size of at
least ``n``; the extra rows are padding: their K/V store is skipped (slot -1), they attend to one key of block 0,
and their output is dropped."""

from collections.abc import Sequence

import torch

from kernels.backend import AttentionBatch, AttentionMetadata
from server.models.interface import Model


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, then every multiple of 8 below ``max_num_seqs``, and ``max_num_seqs`` itself (vLLM's sizes)."""
    sizes = [size for size in (1, 2, 4) if size < max_num_seqs] + list(range(8, max_num_seqs, 8))
    return (*sizes, max_num_seqs)


class StaticDecodeInputs:
    """The tensors a captured graph reads, at fixed addresses: token ids, positions, slots, block tables and
    sequence lengths for up to ``max_rows`` decoding sequences of up to ``max_blocks_per_seq`` blocks each."""

    def __init__(self, max_rows: int, max_blocks_per_seq: int, block_size: int, device: torch.device) -> None:
        self.max_rows, self.max_blocks_per_seq, self.block_size = max_rows, max_blocks_per_seq, block_size
        self.input_ids = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_rows,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_rows, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_rows, dtype=torch.int32, device=device)
        self._no_prefill = torch.zeros(0, dtype=torch.int32, device=device)
        self._no_prefill_tables = torch.zeros(0, 0, dtype=torch.int32, device=device)

    def fits(self, batch: AttentionBatch) -> bool:
        """Whether every row of ``batch`` decodes and it fits these tensors."""
        return (not batch.prefill_seq_lens and batch.num_decode_tokens <= self.max_rows
                and all(len(table) <= self.max_blocks_per_seq for table in batch.decode_block_tables))

    def fill(self, input_ids: Sequence[int], positions: Sequence[int], batch: AttentionBatch, rows: int) -> None:
        """The first ``rows`` rows: ``batch``'s sequences, then padding."""
        real = batch.num_decode_tokens
        padding = rows - real
        width = self.max_blocks_per_seq
        tables = [table + [0] * (width - len(table)) for table in batch.decode_block_tables] + [[0] * width] * padding
        host = (
            (self.input_ids, list(input_ids) + [0] * padding),
            (self.positions, list(positions) + [0] * padding),
            (self.slot_mapping, batch.slot_mapping + [-1] * padding),
            (self.seq_lens, batch.decode_seq_lens + [1] * padding),
            (self.block_tables, tables),
        )
        for tensor, values in host:
            tensor[:rows].copy_(torch.tensor(values, dtype=tensor.dtype, device="cpu"), non_blocking=True)

    def metadata(self, rows: int) -> AttentionMetadata:
        """The first ``rows`` rows as one step's decode metadata."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:rows],
            num_decode_tokens=rows,
            decode_block_tables=self.block_tables[:rows],
            decode_seq_lens=self.seq_lens[:rows],
            decode_max_seq_len=self.max_blocks_per_seq * self.block_size,
            prefill_block_tables=self._no_prefill_tables,
            prefill_cu_seqlens_q=self._no_prefill,
            prefill_seq_lens=self._no_prefill,
            prefill_query_starts=[0],
            prefill_context_lens=[],
        )

    def forward(self, model: Model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], rows: int) -> torch.Tensor:
        """The model over the first ``rows`` rows: what a graph captures."""
        return model.forward(self.input_ids[:rows], self.positions[:rows], kv_caches, self.metadata(rows))


class DecodeGraphs:
    """One captured graph per batch size, sharing one memory pool; captured largest first so that the smaller
    ones reuse its memory."""

    def __init__(self, model: Model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], sizes: Sequence[int],
                 max_blocks_per_seq: int, block_size: int, device: torch.device) -> None:
        self.sizes = tuple(sorted(sizes))
        self.inputs = StaticDecodeInputs(self.sizes[-1], max_blocks_per_seq, block_size, device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self._graphs[size] = self._capture(model, kv_caches, size, pool)

    def _capture(self, model: Model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], size: int,
                 pool: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Every row is padding here: nothing is written to the cache. Two eager runs first, on a side stream as
        # capture requires, settle Triton's autotuning and cuBLAS's workspace for this size.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.inputs.forward(model, kv_caches, size)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            hidden = self.inputs.forward(model, kv_caches, size)
        return graph, hidden

    def run(self, input_ids: Sequence[int], positions: Sequence[int], batch: AttentionBatch) -> torch.Tensor | None:
        """The step's hidden states from the smallest graph that holds it (valid until the next replay), or None
        where none does: a prefill row, more sequences than the largest size, or a longer block table."""
        if not self.inputs.fits(batch):
            return None
        rows = next(size for size in self.sizes if size >= batch.num_decode_tokens)
        self.inputs.fill(input_ids, positions, batch, rows)
        graph, hidden = self._graphs[rows]
        graph.replay()
        return hidden[: batch.num_decode_tokens]
