"""The engine on the real model: preemption, chunked prefill, streaming text, sampling and stop rules."""

import pytest

from server import LLM, SamplingParams
from server.engine.kv_pool import kv_bytes_per_block

pytestmark = pytest.mark.slow

PROMPTS = [
    f"Story {i}: once upon a time there was a {animal} who liked to"
    for i, animal in enumerate(["cat", "dog", "fox", "owl", "bear", "frog", "hen", "wolf"])
]
GREEDY_24 = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def assert_all_blocks_free(llm: LLM) -> None:
    manager = llm.engine.scheduler.block_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert not llm.engine.requests


@pytest.fixture(scope="module")
def small_kv_llm(smollm_folder):
    """Room for 10 blocks of 16 tokens: one request (~40 tokens) fits, eight together do not."""
    import torch

    from server.models.config import ModelConfig

    per_block = kv_bytes_per_block(ModelConfig.from_folder(smollm_folder), 16, torch.float32)
    return LLM(model=str(smollm_folder), dtype="float32", kv_cache_dtype="float32", kv_cache_memory=10 * per_block)


def test_requests_that_do_not_fit_together_are_preempted_and_still_match_their_solo_outputs(small_kv_llm):
    alone = [small_kv_llm.generate(p, GREEDY_24)[0].outputs[0].token_ids for p in PROMPTS]
    preemptions = []
    small_kv_llm.engine.stats_listeners.append(lambda stats: preemptions.append(stats.num_preemptions))
    try:
        together = small_kv_llm.generate(PROMPTS, GREEDY_24)
    finally:
        small_kv_llm.engine.stats_listeners.clear()
    assert sum(preemptions) > 0
    assert [o.outputs[0].token_ids for o in together] == alone
    assert_all_blocks_free(small_kv_llm)


def test_a_prompt_longer_than_the_token_budget_is_chunked_with_the_same_output(smollm_folder, llm_fp32):
    prompt = " ".join(f"item {i} is {'red' if i % 3 else 'blue'}," for i in range(20)) + " and item 20 is"
    chunked = LLM(
        model=str(smollm_folder), dtype="float32", weight_dtype="float32", kv_cache_dtype="float32",
        kv_cache_memory=64 * 2**20, max_num_batched_tokens=16,
    )
    assert len(chunked.tokenizer.encode(prompt)) > 3 * 16
    steps = []
    chunked.engine.stats_listeners.append(lambda stats: steps.append(stats.num_scheduled_tokens))
    expected = llm_fp32.generate(prompt, GREEDY_24)[0].outputs[0].token_ids
    assert chunked.generate(prompt, GREEDY_24)[0].outputs[0].token_ids == expected
    assert max(steps) == 16
    assert_all_blocks_free(chunked)


@pytest.mark.parametrize(
    "prompt, wanted",
    [
        ("我爱北京天安门。我爱北京天安门。我爱北京天安门。我爱北京", lambda ch: "\u4e00" <= ch <= "\u9fff"),
        ("🚀🌍🎉🚀🌍🎉🚀🌍🎉🚀🌍🎉🚀", lambda ch: ord(ch) >= 0x1F300),
    ],
    ids=["chinese", "emoji"],
)
def test_streamed_deltas_concatenate_to_the_final_text_without_broken_characters(llm_fp32, prompt, wanted):
    engine = llm_fp32.engine
    engine.add_request(engine.make_request("stream", prompt, SamplingParams(temperature=0.0, max_tokens=24)))
    deltas, final = [], None
    while engine.has_unfinished_requests():
        for output in engine.step():
            deltas.append(output.outputs[0].delta_text)
            final = output
    assert final is not None and final.finished
    assert "".join(deltas) == final.outputs[0].text
    # Only the last delta may hold a broken character: when max_tokens cut the output mid-character.
    assert all("\ufffd" not in d for d in deltas[:-1])
    assert final.outputs[0].text == llm_fp32.tokenizer.decode(final.outputs[0].token_ids)
    assert any(wanted(ch) for ch in final.outputs[0].text), "the model should continue in the same script"
    assert_all_blocks_free(llm_fp32)


def test_the_same_seed_gives_the_same_text_and_another_seed_differs(llm_fp32):
    def sample(seed):
        params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=seed, max_tokens=24, ignore_eos=True)
        return llm_fp32.generate("Write a poem about the sea:", params)[0].outputs[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert sample(99) != first


def test_stop_strings_end_the_text_before_the_stop_string(llm_fp32):
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=["Paris"])
    [output] = llm_fp32.generate("The capital of France is", params)
    choice = output.outputs[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == "Paris"
    assert "Paris" not in choice.text


def test_stop_token_ids_and_max_tokens(llm_fp32):
    [reference] = llm_fp32.generate("The capital of France is", SamplingParams(temperature=0.0, max_tokens=6))
    third = reference.outputs[0].token_ids[2]
    [stopped] = llm_fp32.generate(
        "The capital of France is", SamplingParams(temperature=0.0, max_tokens=6, stop_token_ids=[third])
    )
    assert stopped.outputs[0].token_ids == reference.outputs[0].token_ids[:3]
    assert (stopped.outputs[0].finish_reason, stopped.outputs[0].stop_reason) == ("stop", third)
    assert reference.outputs[0].finish_reason == "length" and len(reference.outputs[0].token_ids) == 6


def test_repetition_penalty_changes_a_looping_greedy_output(llm_fp32):
    prompt = "one one one one one one one one"
    plain = llm_fp32.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12))[0].outputs[0].token_ids
    penalised = llm_fp32.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.8)
    )[0].outputs[0].token_ids
    assert len(set(penalised)) > len(set(plain))


def test_n_choices_share_the_prompt_and_are_indexed(llm_fp32):
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    [output] = llm_fp32.generate("Name a colour:", params, n=3)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1
    assert_all_blocks_free(llm_fp32)


def test_chat_applies_the_template(llm_fp32):
    [output] = llm_fp32.chat(
        [{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0.0, max_tokens=16)
    )
    assert "Paris" in output.outputs[0].text
    assert output.prompt_token_ids[0] == llm_fp32.tokenizer.encode("<|im_start|>")[0]
