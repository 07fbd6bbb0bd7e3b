"""The offline API from several threads: every call runs its torch work on the one thread that built the model.

OpenMP keeps a pool of workers for each thread that starts parallel work. With more pooled threads than cores, a
worker spins only briefly before it sleeps, and every parallel region of a decode step waits for one to wake: an LLM
built on one thread and called on another (a web app's executor) decoded 2.6x slower on two Zen 5 cores. Calls from
two threads at once also stepped the one engine together, and answered other tokens than the same calls alone.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import server.llm
from server.engine.request import SamplingParams
from server.llm import LLM

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture
def traced_llm(tiny_folder, monkeypatch):
    """A tiny LLM whose build and steps record the thread they run on, in ``llm.threads``."""
    threads: list[tuple[str, int]] = []
    build = server.llm.build_engine

    def traced_build(config):  # noqa: ANN001, ANN202
        threads.append(("build", threading.get_ident()))
        return build(config)

    monkeypatch.setattr(server.llm, "build_engine", traced_build)
    llm = LLM(model=str(tiny_folder), dtype="bfloat16", kv_cache_memory=16 * 2**20)
    step = llm.engine.step

    def traced_step():  # noqa: ANN202
        threads.append(("step", threading.get_ident()))
        return step()

    llm.engine.step = traced_step
    llm.threads = threads
    return llm


def test_a_call_from_another_thread_steps_on_the_thread_that_built_the_model(traced_llm):
    on_main = traced_llm.generate("The colour of the sky is", PARAMS)
    with ThreadPoolExecutor(1) as pool:
        on_worker = pool.submit(traced_llm.generate, "The colour of the sky is", PARAMS).result()
    assert on_worker[0].outputs[0].token_ids == on_main[0].outputs[0].token_ids
    kinds = {kind for kind, _ in traced_llm.threads}
    owners = {thread for _, thread in traced_llm.threads}
    assert kinds == {"build", "step"} and len(owners) == 1, traced_llm.threads
    assert threading.get_ident() not in owners


def test_calls_from_two_threads_at_once_each_get_their_own_answers(traced_llm):
    prompts = ["The colour of the sky is", "Once upon a time"]
    alone = [traced_llm.generate(prompt, PARAMS)[0].outputs[0].token_ids for prompt in prompts]
    with ThreadPoolExecutor(2) as pool:
        together = [future.result()[0].outputs[0].token_ids
                    for future in [pool.submit(traced_llm.generate, prompt, PARAMS) for prompt in prompts]]  # fmt: skip
    assert together == alone
