"""No grammar can take the server down or hold other tenants' compiles: the shapes that overflow llguidance's
stack are refused before compiling, whatever still crashes or runs away costs only a worker process and that
request's 400, compile slots are shared fairly between tenants, and compiled grammars are cached per tenant."""

import asyncio
import json
import os
import time

import httpx
import pytest

from server.api.errors import APIError
from server.api.fair_slots import FairSlots, TenantQueueFull
from server.api.grammar_process import CheckTimedOut, GrammarWorker, WorkerCrashed, WorkerTokenizer
from server.api.grammar_shape import shape_problem
from server.api.grammar_spec import GrammarSpec, json_schema_spec
from server.api.structured_output import WORKER_STACK_BYTES, GrammarCompiler
from server.engine.async_engine import AsyncEngine
from tests.api_server import shared_server


def ref_chain_schema(length: int) -> str:
    """The probe's schema: ``$defs`` whose objects each hold the next by ``$ref``."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(length)}
    return json.dumps({"$defs": defs | {f"d{length}": {"type": "string"}}, "$ref": "#/$defs/d0"})


def lark_chain(length: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(length)) + f'r{length}: "x"\n'


def gbnf_chain(length: int) -> str:
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(length)) + f'r{length} ::= "x"\n'


def many_properties(count: int, tag: str = "") -> str:
    return json.dumps({"type": "object", "properties": {f"{tag}p{i}": {"type": "string"} for i in range(count)}})


# Each segfaulted llguidance in an 8 MB stack when the probe ran it (schema 1,000 and Lark 2,500 did not).
CRASHING = {
    "schema, 1,500 $refs": ("json_schema", ref_chain_schema(1500)),
    "Lark, 6,000 rules": ("grammar", lark_chain(6000)),
    "Lark, 3,000 rules": ("grammar", lark_chain(3000)),
    "GBNF, 4,000 rules": ("grammar", gbnf_chain(4000)),
    "regex, 200 groups": ("regex", "(" * 200 + "a" + ")" * 200),
}
REAL = {
    "schema, 5,000 properties": ("json_schema", many_properties(5000)),
    "schema, 200 $refs": ("json_schema", ref_chain_schema(200)),
    "recursive schema": ("json_schema", json.dumps({"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"})),
    "Lark, 200 rules": ("grammar", lark_chain(200)),
    "GBNF": ("grammar", 'root ::= ("yes" | "no") "!"'),
}
# Passes the shape check (the chain hides in a schema inside Lark) and still overflows a 16 MB stack.
HIDDEN_CRASH = "start: %json " + ref_chain_schema(3000)


@pytest.mark.parametrize("kind, source", CRASHING.values(), ids=CRASHING.keys())
def test_the_shapes_that_crashed_llguidance_are_refused_before_compiling(kind, source):
    assert len(source) < 256 * 1024
    assert shape_problem(kind, source) is not None


@pytest.mark.parametrize("kind, source", REAL.values(), ids=REAL.keys())
def test_real_grammars_pass_the_shape_check(kind, source):
    assert shape_problem(kind, source) is None


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def worker_tokenizer(engine):
    return WorkerTokenizer(engine.tokenizer.to_json(), engine.vocab_size, list(engine.eos_token_ids))


def test_a_grammar_that_crashes_the_compiler_costs_only_the_worker(worker_tokenizer):
    worker = GrammarWorker(lambda: worker_tokenizer, 1 << 30, WORKER_STACK_BYTES)
    try:
        assert worker.check("regex", "a+", 60) is None
        assert shape_problem("grammar", HIDDEN_CRASH) is None
        with pytest.raises(WorkerCrashed):
            worker.check("grammar", HIDDEN_CRASH, 60)
        with pytest.raises(WorkerCrashed):
            worker.check("grammar", lark_chain(6000), 60)
        assert worker.check("grammar", "start: nowhere", 60).startswith("at 1")  # a new worker, answering
    finally:
        worker.stop()


def test_a_runaway_compile_is_killed_at_its_deadline(worker_tokenizer):
    worker = GrammarWorker(lambda: worker_tokenizer, 1 << 30, WORKER_STACK_BYTES)
    try:
        assert worker.check("regex", "a+", 60) is None
        pid = worker._process.pid
        with pytest.raises(CheckTimedOut):
            worker.check("json_schema", many_properties(3000), 0.05)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert worker.check("regex", "a+", 60) is None
    finally:
        worker.stop()


def test_a_compile_past_the_memory_limit_is_a_400(engine):
    frugal = GrammarCompiler(AsyncEngine(engine), timeout_s=60, worker_memory_bytes=20 << 20)
    try:
        with pytest.raises(APIError, match="needed more than 20 MiB") as error:
            asyncio.run(frugal.compile(json_schema_spec(many_properties(3000), "guided_json")))
        assert error.value.status == 400 and error.value.param == "guided_json"
    finally:
        frugal.shutdown()


def test_one_tenants_burst_of_heavy_compiles_does_not_hold_another_tenants(engine):
    compiler = GrammarCompiler(AsyncEngine(engine), timeout_s=60)
    finished: list[str] = []

    async def compile_as(tenant: str, spec: GrammarSpec) -> None:
        await compiler.compile(spec, tenant)
        finished.append(tenant)

    async def burst() -> None:
        await compiler.compile(GrammarSpec("regex", "warm", "guided_regex"), "b")  # starts a worker
        heavy = [compile_as("a", json_schema_spec(json.loads(many_properties(2000, str(i))), "guided_json"))
                 for i in range(4)]
        tasks = [asyncio.create_task(each) for each in heavy]
        await asyncio.sleep(0.05)
        await asyncio.gather(compile_as("b", GrammarSpec("regex", "[0-9]{3}", "guided_regex")), *tasks)

    try:
        asyncio.run(burst())
    finally:
        compiler.shutdown()
    assert finished[0] == "b", finished  # first in a FIFO pool, it would finish third


def test_compiled_grammars_are_cached_per_tenant_unless_shared(engine):
    spec = GrammarSpec("regex", "[a-z]{4}", "guided_regex")
    isolated, shared = GrammarCompiler(AsyncEngine(engine)), GrammarCompiler(AsyncEngine(engine), True)

    async def compiled(compiler: GrammarCompiler, tenant: str):
        return await compiler.compile(spec, tenant)

    try:
        first = asyncio.run(compiled(isolated, "a"))
        assert asyncio.run(compiled(isolated, "a")) is first
        assert asyncio.run(compiled(isolated, "b")) is not first
        assert asyncio.run(compiled(shared, "b")) is asyncio.run(compiled(shared, "a"))
    finally:
        isolated.shutdown()
        shared.shutdown()


def test_fair_slots_take_turns_between_tenants_and_bound_each():
    order: list[str] = []

    async def job(slots: FairSlots, tenant: str) -> None:
        await slots.acquire(tenant)
        order.append(tenant)
        await asyncio.sleep(0.01)
        slots.release(tenant)

    async def main() -> None:
        slots = FairSlots(2, per_tenant=1, max_waiting_per_tenant=4)
        jobs = [asyncio.create_task(job(slots, "a")) for _ in range(6)]
        await asyncio.sleep(0)
        jobs += [asyncio.create_task(job(slots, tenant)) for tenant in ("b", "b", "c")]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        assert [type(r) for r in results].count(TenantQueueFull) == 1  # a's sixth: one runs, four wait

    asyncio.run(main())
    third_of_a = [i for i, tenant in enumerate(order) if tenant == "a"][2]
    assert order.index("c") < third_of_a and order.count("b") == 2, order
    assert order.count("a") == 5


def test_a_waiter_that_gives_up_leaves_the_queue():
    async def main() -> None:
        slots = FairSlots(1, per_tenant=1, max_waiting_per_tenant=1)
        await slots.acquire("a")
        waiting = asyncio.create_task(slots.acquire("a"))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        slots.release("a")
        await asyncio.wait_for(slots.acquire("a"), 1)  # neither the cancelled waiter nor a lost slot in the way

    asyncio.run(main())


# --- on a real server ---------------------------------------------------------------------------------------

SERVED = {
    "response_format, 1,500 $refs": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "chain", "schema": json.loads(ref_chain_schema(1500))}}}, "response_format", "before compiling"),
    "guided_grammar, Lark 6,000 rules": ({"guided_grammar": lark_chain(6000)}, "guided_grammar", "before compiling"),
    "guided_grammar, GBNF 4,000 rules": ({"guided_grammar": gbnf_chain(4000)}, "guided_grammar", "before compiling"),
    "guided_grammar, crashing the worker": ({"guided_grammar": HIDDEN_CRASH}, "guided_grammar", "crashed"),
}


@pytest.mark.server
@pytest.mark.parametrize("fields, param, reason", SERVED.values(), ids=SERVED.keys())
def test_a_grammar_that_crashed_the_server_is_a_400_and_the_server_serves_on(smollm_folder, fields, param, reason):
    server = shared_server(smollm_folder)
    request = {"model": "smollm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    started = time.monotonic()
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=request, timeout=120)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and reason in error["message"], error
    assert time.monotonic() - started < 60
    assert server.process.poll() is None
    plain = {"model": "smollm", "prompt": "Hello", "max_tokens": 2}
    assert httpx.post(f"{server.base_url}/v1/completions", json=plain, timeout=60).status_code == 200
    assert httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                      json=plain | {"guided_regex": "[0-9]{2}"}).status_code == 200
