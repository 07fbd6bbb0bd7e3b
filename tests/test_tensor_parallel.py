"""Tensor parallelism on the CPU: real gloo process groups on 127.0.0.1, this process as rank 0 and the workers it
starts. Greedy tokens equal one process's, token for token: in a batch, through chunked prefill, on a tiny random
Llama, on every family's tiny checkpoint and on the bundled SmolLM2 (9 heads and 3 KV heads: 3 ranks, since 2 do
not divide them). A worker killed mid-run makes the next step fail at once, never hang."""

from pathlib import Path

import pytest
import torch

from kernels.backend import AttentionBatch, TorchAttention
from server import LLM, SamplingParams
from server.distributed.launch import TensorParallelError
from server.distributed.messages import pack_step, unpack_step
from server.distributed.sharding import check_divides, rank_config, shard_weights
from server.models.config import ModelConfig
from server.models.linear import fp16_weight_gemm_available
from tests.tiny_families import FAMILIES, write_hf_checkpoint
from tests.tiny_model import TINY_CONFIG

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who mended his nets",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# fp32 throughout, and a step budget under the longest prompt: its prefill runs in chunks, beside the decodes.
ENGINE = {"dtype": "float32", "weight_dtype": "float32", "kv_cache_dtype": "float32", "kv_cache_memory": 32 * 2**20,
          "max_num_batched_tokens": 16}


def greedy_tokens(llm: LLM, prompts: list[str] = PROMPTS) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in llm.generate(prompts, GREEDY)]


def tensor_parallel_llm(model: Path | None, size: int) -> LLM:
    return LLM(str(model) if model is not None else None, tensor_parallel_size=size, **ENGINE)


def close(llm: LLM) -> None:
    llm.engine.runner.model.close()


def assert_all_blocks_free(llm: LLM) -> None:
    block_manager = llm.engine.scheduler.block_manager
    assert block_manager.num_free_blocks == block_manager.num_blocks


@pytest.fixture(scope="module")
def tiny_pair(tiny_folder):
    one, two = tensor_parallel_llm(tiny_folder, 1), tensor_parallel_llm(tiny_folder, 2)
    yield one, two
    close(two)


def test_two_ranks_give_one_process_greedy_tokens_in_a_batch_through_chunked_prefill(tiny_pair):
    one, two = tiny_pair
    assert two.engine.info.tensor_parallel_size == 2
    assert greedy_tokens(two) == greedy_tokens(one)
    assert_all_blocks_free(two)
    # Each rank ran every forward pass, and rank 0 timed them all.
    assert len(two.engine.runner.model.rank_step_durations_s) == 2


def test_two_ranks_one_prompt_at_a_time_and_with_a_cached_prefix(tiny_pair):
    one, two = tiny_pair
    for prompt in PROMPTS[:2]:
        assert greedy_tokens(two, [prompt]) == greedy_tokens(one, [prompt])
    # The same prompt again: its full blocks come from the prefix cache, on every rank's pool.
    assert greedy_tokens(two, [PROMPTS[1]]) == greedy_tokens(one, [PROMPTS[1]])
    assert_all_blocks_free(two)


def test_each_rank_holds_its_share_of_the_heads_and_the_vocabulary(tiny_pair):
    _, two = tiny_pair
    model = two.engine.runner.model
    assert model.config.num_attention_heads == TINY_CONFIG["num_attention_heads"] // 2
    assert two.engine.runner.kv_caches[0][0].shape[2] == TINY_CONFIG["num_key_value_heads"] // 2
    assert model.model.embed.local.table.shape[0] == TINY_CONFIG["vocab_size"] // 2


def test_a_size_that_does_not_divide_the_heads_is_refused_in_one_line():
    config = ModelConfig.from_hf_dict(
        {**TINY_CONFIG, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    )
    with pytest.raises(ValueError, match=r"^--tensor-parallel-size 2 does not divide the model's 9 attention heads "
                                         r"and 3 KV heads$"):
        check_divides(config, 2)
    check_divides(config, 3)


def test_shards_cut_heads_mlp_and_a_padded_vocabulary():
    config = ModelConfig.from_hf_dict({**TINY_CONFIG, "vocab_size": 5, "hidden_size": 4, "intermediate_size": 6,
                                       "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2})
    weights = {
        "model.embed_tokens.weight": torch.arange(20.0).reshape(5, 4),
        "model.layers.0.self_attn.qkv_proj.weight": torch.arange(48.0).reshape(12, 4),
        "model.layers.0.self_attn.o_proj.weight": torch.arange(16.0).reshape(4, 4),
        "model.layers.0.input_layernorm.weight": torch.ones(4),
    }
    first, last = (shard_weights(weights, config, rank, 2) for rank in (0, 1))
    # Rows 0-2 and 3-4 of the vocabulary, the second rank's padded with a zero row.
    assert torch.equal(first["model.embed_tokens.weight"], weights["model.embed_tokens.weight"][:3])
    assert torch.equal(last["model.embed_tokens.weight"][:2], weights["model.embed_tokens.weight"][3:])
    assert not last["model.embed_tokens.weight"][2].any()
    # Fused Q/K/V: each rank gets one head of each of Q, K and V (rows 0-1, 4-5, 8-9 for rank 0).
    qkv = weights["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(first["model.layers.0.self_attn.qkv_proj.weight"], qkv[[0, 1, 4, 5, 8, 9]])
    o_proj = "model.layers.0.self_attn.o_proj.weight"
    assert torch.equal(last[o_proj], weights[o_proj][:, 2:])
    assert first["model.layers.0.input_layernorm.weight"] is weights["model.layers.0.input_layernorm.weight"]
    assert rank_config(config, 2).num_key_value_heads == 1


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.experts.weight"])
def test_a_tensor_it_cannot_split_is_refused(name):
    config = ModelConfig.from_hf_dict(TINY_CONFIG)
    with pytest.raises(ValueError, match=f"does not know how to split {name}"):
        shard_weights({name: torch.ones(4, 4) if "weight" in name else torch.ones(4)}, config, 0, 2)


def test_a_step_packs_into_one_int64_tensor_and_back():
    batch = AttentionBatch([5, 6, 40], [[0]], [6], [[2, 3]], [0, 2], [34])
    meta = TorchAttention(torch.device("cpu")).prepare(batch)
    input_ids, positions = torch.tensor([7, 8, 9]), torch.tensor([5, 32, 33])
    layout, packed = pack_step(input_ids, positions, meta)
    assert packed.dtype == torch.int64 and packed.numel() == layout.numel
    ids, pos, back = unpack_step(layout, packed)
    assert torch.equal(ids, input_ids) and torch.equal(pos, positions)
    assert back.decode_block_tables.dtype == torch.int32
    assert torch.equal(back.decode_block_tables, meta.decode_block_tables)
    assert back.prefill_query_starts == [0, 2] and back.prefill_context_lens == [34]


def test_a_killed_worker_fails_the_next_step_at_once(tiny_pair, tiny_folder):
    """The last test on ``tiny_pair``: it ends that group."""
    _, two = tiny_pair
    worker = two.engine.runner.model.workers.processes[0]
    assert greedy_tokens(two, PROMPTS[:1])
    worker.kill()
    worker.wait(30)
    with pytest.raises(TensorParallelError, match="rank 1 exited with status -9"):
        two.generate(PROMPTS[:1], GREEDY)
    # The group is over: its other ranks are stopped and the process group is left, so a new engine can start.
    with pytest.raises(TensorParallelError):
        two.generate(PROMPTS[:1], GREEDY)
    again = tensor_parallel_llm(tiny_folder, 2)
    assert greedy_tokens(again, PROMPTS[:1])
    close(again)


@pytest.mark.skipif(not fp16_weight_gemm_available(), reason="no fbgemm: no fp16 weights under fp32")
def test_the_ranks_keep_the_python_layer_loop_and_its_all_reduces(tiny_folder):
    # fp16 weights under fp32: one process decodes in one compiled call, which knows nothing of ranks. After
    # tiny_pair's group has ended: one tensor-parallel engine per process.
    engine = {**ENGINE, "weight_dtype": "auto", "kv_cache_dtype": "auto"}
    one = LLM(str(tiny_folder), **engine)
    two = LLM(str(tiny_folder), tensor_parallel_size=2, **engine)
    try:
        assert one.engine.runner.plan.decode_path == "one-call"
        assert two.engine.runner.one_call is None and two.engine.runner.plan.decode_path == "layer-loop"
        assert two.engine.runner.plan.decode_path_reason.startswith("tensor parallelism")
        assert greedy_tokens(two) == greedy_tokens(one)
    finally:
        close(two)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_gives_one_process_greedy_tokens_on_two_ranks(family, tmp_path, smollm_folder):
    folder = write_hf_checkpoint(FAMILIES[family], tmp_path / family, smollm_folder)
    expected = greedy_tokens(tensor_parallel_llm(folder, 1))
    two = tensor_parallel_llm(folder, 2)
    try:
        assert greedy_tokens(two) == expected
    finally:
        close(two)


@pytest.mark.slow
def test_the_bundled_model_on_three_ranks_gives_one_process_greedy_tokens():
    prompts = PROMPTS[:2]
    expected = greedy_tokens(tensor_parallel_llm(None, 1), prompts)
    three = tensor_parallel_llm(None, 3)
    try:
        assert greedy_tokens(three, prompts) == expected
    finally:
        close(three)
