"""Each step's model FLOPs and the KV waste it reports, against counts made from first principles."""

import pytest
from safetensors import safe_open

from server import LLM, SamplingParams
from server.engine.flops import ModelFlops
from server.engine.stats import StepStats
from server.models.config import ModelConfig
from tests.tiny_model import TINY_CONFIG

BLOCK_SIZE = 16


@pytest.fixture
def llm(tiny_folder):
    return LLM(model=str(tiny_folder), dtype="float32", kv_cache_memory=8 * 2**20, block_size=BLOCK_SIZE,
               enable_prefix_caching=False, max_num_batched_tokens=24)


def record_steps(llm: LLM) -> list[StepStats]:
    steps: list[StepStats] = []
    llm.engine.stats_listeners.append(steps.append)
    return steps


def test_flops_per_token_are_twice_the_weight_matrices_the_checkpoint_holds(tiny_folder):
    flops = ModelFlops.of(ModelConfig.from_folder(tiny_folder))
    layer_matrices = 0
    with safe_open(str(tiny_folder / "model.safetensors"), framework="pt") as checkpoint:
        for name in checkpoint.keys():  # noqa: SIM118 - safe_open is not iterable
            shape = checkpoint.get_slice(name).get_shape()
            if name.startswith("model.layers.") and len(shape) == 2:
                layer_matrices += shape[0] * shape[1]
    assert flops.per_token == 2 * layer_matrices
    assert flops.per_sampled_token == 2 * TINY_CONFIG["hidden_size"] * TINY_CONFIG["vocab_size"]


def test_step_flops_add_up_to_every_token_seeing_its_whole_prefix(llm, tiny_folder):
    """Chunked prefill (budget 24 < the 40-token prompt) must not change the total."""
    flops = ModelFlops.of(ModelConfig.from_folder(tiny_folder))
    steps = record_steps(llm)
    prompts = [list(range(1000, 1040)), list(range(2000, 2007))]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    expected = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        computed = len(prompt) + len(output.outputs[0].token_ids) - 1  # the last token is sampled, never fed
        expected += computed * flops.per_token
        expected += sum(position + 1 for position in range(computed)) * flops.per_attended_key
        expected += len(output.outputs[0].token_ids) * flops.per_sampled_token
    assert any(step.num_prefill_seqs and step.num_scheduled_tokens == 24 for step in steps), "prefill was not chunked"
    assert sum(step.model_flops for step in steps) == expected


def test_kv_waste_is_the_unfilled_tail_of_the_last_block(llm):
    steps = record_steps(llm)
    llm.generate([list(range(1000, 1020))], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    first = steps[0]
    # 20 prompt tokens fill one block of 16 and 4 slots of a second: 12 of 32 held slots are empty.
    assert (first.num_kv_slots_held, first.num_kv_slots_filled) == (32, 20)
    assert first.kv_cache_waste_ratio == pytest.approx(12 / 32)
    second = steps[1]
    assert (second.num_kv_slots_held, second.num_kv_slots_filled) == (32, 21)
    assert steps[-1].num_kv_slots_held == 0 and steps[-1].kv_cache_waste_ratio == 0.0
