"""CUDA graphs of decode steps (server/engine/decode_graphs.py). The capture and replay need a GPU and run in
gpu_check/decode_graphs_gpu.py; here, on the real SmolLM2, the CPU runs what a graph captures: the model over the
static, padded inputs gives the sequences' rows as the unpadded step does, padding writes nothing to the KV cache,
and a smaller step after a larger one leaves no stale rows. Where graphs cannot run, asking for them stops start-up
with one line."""

import pytest
import torch

from kernels.backend import AttentionBatch
from server import LLM
from server.engine.decode_graphs import StaticDecodeInputs, graph_batch_sizes
from server.engine.kv_pool import allocate_kv_caches

BLOCK = 16
PROMPT_LENGTHS = (5, 17, 33)  # one, two and three blocks


def test_graph_batch_sizes_cover_every_batch_up_to_max_num_seqs():
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(8) == (1, 2, 4, 8)
    assert graph_batch_sizes(20) == (1, 2, 4, 8, 16, 20)
    sizes = graph_batch_sizes(128)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-2:] == (120, 128) and len(sizes) == 3 + 16


@pytest.fixture(scope="module")
def model(smollm_folder):
    llm = LLM(model=str(smollm_folder), dtype="float32", weight_dtype="float32", kv_cache_memory=16 * 2**20)
    return llm.engine.runner.model


def prefilled_caches(model) -> tuple[list, list[list[int]]]:
    """A fresh cache holding each prompt of PROMPT_LENGTHS tokens in its own blocks, and their block tables."""
    caches = allocate_kv_caches(model.config, 16, BLOCK, torch.float32, torch.device("cpu"))
    tables, slots, ids, positions, starts, next_block = [], [], [], [], [0], 1  # block 0 stays empty
    for length in PROMPT_LENGTHS:
        table = list(range(next_block, next_block + length // BLOCK + 1))
        next_block += len(table)
        tables.append(table)
        ids += [(7 * p + length) % 1000 + 10 for p in range(length)]
        positions += list(range(length))
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(length)]
        starts.append(starts[-1] + length)
    batch = AttentionBatch(slots, [], [], tables, starts, list(PROMPT_LENGTHS))
    model.forward(torch.tensor(ids), torch.tensor(positions), caches, model.attention.prepare(batch))
    return caches, tables


def decode_step(tables: list[list[int]]) -> tuple[list[int], list[int], AttentionBatch]:
    """The next token of each prompt: ids, positions and the decode batch."""
    positions = list(PROMPT_LENGTHS)
    slots = [table[p // BLOCK] * BLOCK + p % BLOCK for table, p in zip(tables, positions, strict=True)]
    batch = AttentionBatch(slots, tables, [p + 1 for p in positions], [], [0], [])
    return [11, 222, 3333], positions, batch


def test_padded_static_inputs_give_the_unpadded_step_and_padding_writes_nothing(model):
    caches, tables = prefilled_caches(model)
    ids, positions, batch = decode_step(tables)
    unpadded = [(k.clone(), v.clone()) for k, v in caches]
    expected = model.forward(torch.tensor(ids), torch.tensor(positions), unpadded, model.attention.prepare(batch))

    inputs = StaticDecodeInputs(max_rows=8, max_blocks_per_seq=6, block_size=BLOCK, device=torch.device("cpu"))
    assert inputs.fits(batch)
    padded = [(k.clone(), v.clone()) for k, v in caches]
    inputs.fill(ids, positions, batch, rows=8)
    hidden = inputs.forward(model, padded, rows=8)
    assert hidden.shape[0] == 8
    torch.testing.assert_close(hidden[:3], expected, rtol=1e-5, atol=1e-5)
    written = torch.zeros(16 * BLOCK, dtype=torch.bool)
    written[batch.slot_mapping] = True
    for (k_before, v_before), (k_padded, v_padded), (k_unpadded, v_unpadded) in zip(caches, padded, unpadded,
                                                                                    strict=True):
        for before, after, reference in ((k_before, k_padded, k_unpadded), (v_before, v_padded, v_unpadded)):
            flat_before, flat_after = before.flatten(0, 1), after.flatten(0, 1)
            assert torch.equal(flat_after[~written], flat_before[~written])  # padding rows stored nothing
            torch.testing.assert_close(flat_after[written], reference.flatten(0, 1)[written], rtol=1e-5, atol=1e-5)
            assert not torch.equal(flat_after[written], flat_before[written])


def test_a_smaller_step_after_a_larger_one_keeps_no_stale_rows(model):
    caches, tables = prefilled_caches(model)
    ids, positions, batch = decode_step(tables)
    inputs = StaticDecodeInputs(max_rows=8, max_blocks_per_seq=6, block_size=BLOCK, device=torch.device("cpu"))
    inputs.fill(ids, positions, batch, rows=8)
    one = AttentionBatch(batch.slot_mapping[:1], tables[:1], batch.decode_seq_lens[:1], [], [0], [])
    inputs.fill(ids[:1], positions[:1], one, rows=2)
    meta = inputs.metadata(2)
    assert meta.num_decode_tokens == 2 and meta.decode_block_tables.shape == (2, 6)
    assert meta.slot_mapping.tolist() == [batch.slot_mapping[0], -1]
    assert meta.decode_seq_lens.tolist() == [PROMPT_LENGTHS[0] + 1, 1]
    assert meta.decode_block_tables[1].tolist() == [0] * 6
    assert inputs.input_ids[:2].tolist() == [ids[0], 0]


def test_only_decode_steps_that_fit_are_replayed(model):
    _, tables = prefilled_caches(model)
    _, _, batch = decode_step(tables)
    assert not StaticDecodeInputs(2, 6, BLOCK, torch.device("cpu")).fits(batch)  # three sequences
    assert not StaticDecodeInputs(8, 2, BLOCK, torch.device("cpu")).fits(batch)  # a three-block table
    with_prompt = AttentionBatch(batch.slot_mapping + [5], tables, batch.decode_seq_lens, [[4]], [0, 1], [1])
    assert not StaticDecodeInputs(8, 6, BLOCK, torch.device("cpu")).fits(with_prompt)


def test_cuda_graphs_where_they_cannot_run_stop_start_up_saying_why(smollm_folder):
    with pytest.raises(ValueError, match="--decode-path cuda-graphs cannot run here: CUDA graphs need a CUDA "
                                         "device; this engine runs on cpu"):
        LLM(model=str(smollm_folder), decode_path="cuda-graphs", kv_cache_memory=16 * 2**20)
