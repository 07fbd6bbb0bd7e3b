"""The repetition detector on real SmolLM2 outputs: ordinary answers pass, a forced loop is caught."""

import pytest

from server import LLM, SamplingParams
from telemetry.quality import output_anomalies

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for staying healthy.",
    "Explain what a prime number is.",
    "Write a short poem about autumn.",
]


@pytest.fixture(scope="module")
def looping_llm(smollm_folder):
    return LLM(model=str(smollm_folder), dtype="float32", kv_cache_memory=64 * 2**20, stop_on_repetition=True)


def test_ordinary_answers_are_not_flagged(looping_llm):
    outputs = looping_llm.chat(
        [[{"role": "user", "content": q}] for q in QUESTIONS], SamplingParams(temperature=0.0, max_tokens=96)
    )
    for output in outputs:
        choice = output.outputs[0]
        assert choice.stop_reason != "repetition", choice.text
        assert "repetition_loop" not in output_anomalies(choice.token_ids, choice.finish_reason, None)


def test_a_forced_loop_is_stopped_and_reported(looping_llm):
    params = SamplingParams(temperature=0.0, max_tokens=200, repetition_penalty=0.5)
    [output] = looping_llm.generate("apple banana apple banana apple banana", params)
    choice = output.outputs[0]
    assert (choice.finish_reason, choice.stop_reason) == ("stop", "repetition")
    assert len(choice.token_ids) < 200
    assert "repetition_loop" in output_anomalies(choice.token_ids, choice.finish_reason, choice.stop_reason)
