"""AsyncEngine on a tiny random Llama: the loop thread, streams, batching per step, abort, failure and stop."""

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from server import LLM, SamplingParams
from server.config import EngineConfig
from server.engine import async_engine
from server.engine.async_engine import AsyncEngine, EngineDeadError, EngineStoppedError
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine.request import QueueFullError

PROMPTS = [[1000 + i, 2000 + i, 3000 + i] for i in range(4)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
TIMEOUT_S = 60


def make_engine(folder, **overrides) -> LLMEngine:
    config = EngineConfig(model=str(folder), dtype="float32", kv_cache_memory=8 * 2**20, **overrides)
    return build_engine(config)


def run(coroutine_function, engine: AsyncEngine):
    """Start the loop thread on a fresh event loop, run the test body, and always stop the thread."""

    async def main():
        engine.start(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(coroutine_function(), TIMEOUT_S)
        finally:
            engine.stop()
            await asyncio.to_thread(engine.join, TIMEOUT_S)

    return asyncio.run(main())


def requests_for(engine: AsyncEngine, tag: str, params: SamplingParams = GREEDY):
    return [engine.make_request(f"{tag}-{i}", prompt, params) for i, prompt in enumerate(PROMPTS)]


def assert_all_blocks_free(engine: AsyncEngine) -> None:
    health = engine.health()
    assert health.num_unfinished == 0 and health.num_free_blocks == health.num_blocks


def test_outputs_match_the_offline_engine_and_stats_come_from_the_loop_thread(tiny_folder):
    offline = LLM(model=str(tiny_folder), dtype="float32", kv_cache_memory=8 * 2**20).generate(PROMPTS, GREEDY)
    llm_engine = make_engine(tiny_folder)
    stats_threads = set()
    llm_engine.stats_listeners.append(lambda stats: stats_threads.add(threading.current_thread().name))
    engine = AsyncEngine(llm_engine)

    async def body():
        streams = [await engine.add([r]) for r in requests_for(engine, "match")]

        async def collect(stream):
            return [output async for output in stream]

        return await asyncio.gather(*(collect(s) for s in streams))

    results = run(body, engine)
    for outputs, expected in zip(results, offline, strict=True):
        assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
        assert outputs[-1].outputs[0].token_ids == expected.outputs[0].token_ids
        assert sum(len(o.outputs[0].delta_token_ids) for o in outputs) == GREEDY.max_tokens
    assert stats_threads == {"vigil-engine-loop"}
    assert_all_blocks_free(engine)


def test_each_step_reaches_the_event_loop_in_one_callback(tiny_folder, monkeypatch):
    llm_engine = make_engine(tiny_folder)
    steps_with_outputs = []
    llm_engine.stats_listeners.append(lambda stats: steps_with_outputs.append(stats.num_generation_tokens))
    deliveries = []
    real_deliver = async_engine._deliver
    monkeypatch.setattr(async_engine, "_deliver", lambda batch: (deliveries.append(len(batch)), real_deliver(batch)))
    engine = AsyncEngine(llm_engine)

    async def body():
        stream = await engine.add(requests_for(engine, "batched"))
        return [output async for output in stream]

    outputs = run(body, engine)
    assert len(outputs) == len(PROMPTS) * GREEDY.max_tokens
    assert deliveries == [n for n in steps_with_outputs if n]  # one callback per step, carrying all its outputs
    assert max(deliveries) == len(PROMPTS)


def test_a_final_only_stream_gets_each_requests_last_output_in_one_callback(tiny_folder, monkeypatch):
    """An unstreamed answer: the event loop is woken once, for the last outputs, which hold what every output of
    a streamed twin added up to; the tokens before it are counted for an abort."""
    deliveries = []
    real_deliver = async_engine._deliver
    monkeypatch.setattr(async_engine, "_deliver", lambda batch: (deliveries.append(len(batch)), real_deliver(batch)))
    engine = AsyncEngine(make_engine(tiny_folder))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2)

    async def body():
        streamed = [output async for output in await engine.add(requests_for(engine, "every", params))]
        streamed_deliveries = len(deliveries)
        stream = await engine.add(requests_for(engine, "final", params), final_only=True)
        finals = [output async for output in stream]
        return streamed, deliveries[streamed_deliveries:], finals, stream.num_generated

    streamed, final_deliveries, finals, generated = run(body, engine)
    assert final_deliveries == [len(PROMPTS)]
    twins = {output.request_id.removeprefix("every-"): output.outputs[0] for output in streamed if output.finished}
    assert len(finals) == len(PROMPTS) and all(output.finished for output in finals)
    for output in finals:
        final, twin = output.outputs[0], twins[output.request_id.removeprefix("final-")]
        assert (final.token_ids, final.text, final.logprobs) == (twin.token_ids, twin.text, twin.logprobs)
        assert len(final.token_ids) == params.max_tokens
    assert generated == {f"final-{i}": params.max_tokens - 1 for i in range(len(PROMPTS))}
    assert_all_blocks_free(engine)


def test_engines_that_share_a_device_load_and_step_on_its_one_thread(tiny_folder):
    """Two served models: each engine's loading and steps run on the shared device thread, never on the engines'
    own threads (a second OpenMP pool would stop the first's workers spinning), and both answer as alone."""
    offline = LLM(model=str(tiny_folder), dtype="float32", kv_cache_memory=8 * 2**20).generate(PROMPTS, GREEDY)
    ran_on: list[tuple[str, str]] = []

    def loader():  # noqa: ANN202
        ran_on.append(("load", threading.current_thread().name))
        engine = make_engine(tiny_folder)
        step = engine.step
        engine.step = lambda: (ran_on.append(("step", threading.current_thread().name)), step())[1]
        return engine

    with ThreadPoolExecutor(1, thread_name_prefix="device") as device:
        engines = [AsyncEngine(loader, device), AsyncEngine(loader, device)]

        async def body():
            for engine in engines:
                engine.start(asyncio.get_running_loop())
            try:
                while any(engine.loading for engine in engines):
                    await asyncio.sleep(0.01)

                async def collect(engine, tag):  # noqa: ANN001, ANN202
                    return [output async for output in await engine.add(requests_for(engine, tag))]

                return await asyncio.wait_for(asyncio.gather(collect(engines[0], "a"), collect(engines[1], "b")),
                                              TIMEOUT_S)  # fmt: skip
            finally:
                for engine in engines:
                    engine.stop()
                    await asyncio.to_thread(engine.join, TIMEOUT_S)

        results = asyncio.run(body())
    for outputs in results:
        finals = {output.request_id.split("-", 1)[1]: output for output in outputs if output.finished}
        assert [finals[str(i)].outputs[0].token_ids for i in range(len(PROMPTS))] == [
            expected.outputs[0].token_ids for expected in offline]  # fmt: skip
    assert {kind for kind, _ in ran_on} == {"load", "step"}
    assert {thread for _, thread in ran_on} == {"device_0"}, ran_on


def test_the_idle_loop_blocks_instead_of_spinning(tiny_folder):
    llm_engine = make_engine(tiny_folder)
    polls = []
    real_check = llm_engine.has_work
    llm_engine.has_work = lambda: (polls.append(1), real_check())[1]
    engine = AsyncEngine(llm_engine)

    async def body():
        await asyncio.sleep(0.5)
        return len(polls)

    assert run(body, engine) <= 2


def test_what_exists_when_the_loop_starts_is_kept_out_of_full_collections(tiny_folder):
    gc.unfreeze()
    llm_engine = make_engine(tiny_folder)
    engine = AsyncEngine(llm_engine)

    async def body():
        await engine.add(requests_for(engine, "frozen")[:1])  # answered only once the loop thread serves
        return gc.get_freeze_count()

    try:
        frozen = run(body, engine)
        assert frozen > 10_000  # torch, the model, the tests' own objects: all of them
    finally:
        gc.unfreeze()


def test_a_group_is_admitted_whole_or_not_at_all(tiny_folder):
    engine = AsyncEngine(make_engine(tiny_folder, max_queue_len=3))

    async def body():
        with pytest.raises(QueueFullError):
            await engine.add(requests_for(engine, "too-many"))
        assert_all_blocks_free(engine)
        stream = await engine.add(requests_for(engine, "fits")[:3])
        return [output async for output in stream]

    assert len(run(body, engine)) == 3 * GREEDY.max_tokens
    assert_all_blocks_free(engine)


def test_closing_a_stream_aborts_its_requests_and_frees_their_blocks(tiny_folder):
    engine = AsyncEngine(make_engine(tiny_folder))
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def body():
        stream = await engine.add(requests_for(engine, "closed", long))
        await anext(stream)
        stream.close()
        deadline = time.monotonic() + 5
        while engine.health().num_unfinished or engine.health().num_free_blocks < engine.health().num_blocks:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)

    run(body, engine)
    assert_all_blocks_free(engine)


class StepFault(RuntimeError):
    pass


def test_a_failing_step_fails_every_stream_and_marks_the_engine_dead(tiny_folder):
    llm_engine = make_engine(tiny_folder)
    engine = AsyncEngine(llm_engine)
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    def failing_step():
        raise StepFault("a step that fails, as a real engine failure would")

    async def body():
        first = await engine.add(requests_for(engine, "a", long)[:2])
        second = await engine.add(requests_for(engine, "b", long)[2:])
        await anext(first)
        llm_engine.step = failing_step
        for stream in (first, second):
            with pytest.raises(EngineDeadError, match="engine error"):
                async for _ in stream:
                    pass
        health = engine.health()
        assert not health.alive and "StepFault" in health.error
        with pytest.raises(EngineDeadError):
            await engine.add(requests_for(engine, "after"))

    run(body, engine)


def test_stop_ends_the_streams_in_flight_and_the_thread(tiny_folder):
    engine = AsyncEngine(make_engine(tiny_folder))
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)

    async def body():
        stream = await engine.add(requests_for(engine, "stopped", long))
        await anext(stream)
        engine.stop()
        with pytest.raises(EngineStoppedError):
            async for _ in stream:
                pass
        with pytest.raises(EngineStoppedError):
            await engine.add(requests_for(engine, "late"))

    run(body, engine)
    assert not engine.health().alive
