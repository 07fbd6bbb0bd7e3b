"""Speculative decoding inside the paged engine, on the bundled model: at temperature 0 it changes no token, on
text that repeats itself it keeps many guesses, and it leaks no KV block."""

import pytest

from server import LLM, SamplingParams
from server.bench.spec_workloads import REPETITIVE_PROMPTS
from server.config import SpeculativeConfig

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=48)
NGRAM = SpeculativeConfig(num_speculative_tokens=4)


@pytest.fixture(scope="module")
def engines(smollm_folder):
    def make(**extra):
        return LLM(model=str(smollm_folder), dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
                   kv_cache_memory=64 * 2**20, **extra)

    return make(), make(speculative_config=NGRAM)


def assert_every_block_free(llm: LLM) -> None:
    manager = llm.engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks and not llm.engine.requests
    assert llm.engine.proposer is None or not llm.engine.proposer.indexes


def test_greedy_output_is_token_for_token_the_same_and_guesses_are_kept(engines):
    plain, speculative = engines
    steps = []
    speculative.engine.stats_listeners.append(steps.append)
    try:
        expected = [o.outputs[0].token_ids for o in plain.generate(REPETITIVE_PROMPTS, GREEDY)]
        actual = [o.outputs[0].token_ids for o in speculative.generate(REPETITIVE_PROMPTS, GREEDY)]
    finally:
        speculative.engine.stats_listeners.clear()
    assert actual == expected
    drafted = sum(s.num_draft_tokens for s in steps)
    accepted = sum(s.num_accepted_tokens for s in steps)
    assert drafted > 0 and 0 < accepted <= drafted
    assert sum(s.num_generation_tokens for s in steps) == sum(len(t) for t in expected)
    assert_every_block_free(speculative)


def test_stop_strings_max_tokens_and_chunked_prompts_hold_under_speculation(engines, smollm_folder):
    plain, speculative = engines
    for params in (SamplingParams(temperature=0.0, max_tokens=7), SamplingParams(temperature=0.0, max_tokens=60,
                                                                                   stop=[" the"])):
        expected = plain.generate(REPETITIVE_PROMPTS[:2], params)
        actual = speculative.generate(REPETITIVE_PROMPTS[:2], params)
        assert [o.outputs[0].token_ids for o in actual] == [o.outputs[0].token_ids for o in expected]
        assert [o.outputs[0].text for o in actual] == [o.outputs[0].text for o in expected]
    chunked = LLM(model=str(smollm_folder), dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
                  kv_cache_memory=64 * 2**20, max_num_batched_tokens=24, speculative_config=NGRAM)
    expected = [o.outputs[0].token_ids for o in plain.generate(REPETITIVE_PROMPTS, GREEDY)]
    assert [o.outputs[0].token_ids for o in chunked.generate(REPETITIVE_PROMPTS, GREEDY)] == expected
    assert_every_block_free(chunked)


def test_sampled_requests_and_requests_speculation_cannot_serve_run_and_free_everything(engines):
    _, speculative = engines
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=32)
    penalised = SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=1.3, logprobs=2)
    outputs = speculative.generate(REPETITIVE_PROMPTS, sampled) + speculative.generate(REPETITIVE_PROMPTS, penalised)
    assert all(len(o.outputs[0].token_ids) > 0 for o in outputs)
    assert all(o.outputs[0].logprobs and len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids)
               for o in outputs[len(REPETITIVE_PROMPTS):])
    again = speculative.generate(REPETITIVE_PROMPTS, sampled)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in outputs[: len(again)]]
    assert_every_block_free(speculative)


def test_verification_steps_take_the_compiled_decode_loop(smollm_folder):
    """A guess's row attends as a decode row, so a step of one sequence and its guesses runs the compiled loop."""
    llm = LLM(model=str(smollm_folder), kv_cache_memory=64 * 2**20, speculative_config=NGRAM)
    runner = llm.engine.runner
    if runner.one_call is None:
        pytest.skip(f"the compiled decode loop does not run here: {runner.plan.decode_path_reason}")
    compiled, rows = runner.one_call, []

    def counted(input_ids, *rest):
        rows.append(len(input_ids))
        return compiled(input_ids, *rest)

    runner.one_call = counted
    llm.generate(REPETITIVE_PROMPTS[:1], GREEDY)
    assert rows and max(rows) > 1
    assert_every_block_free(llm)
