"""Structured output through the real llguidance and a real (tiny, random) engine: masks applied inside the batch,
grammars compiled within bounds, bad grammars refused naming their field."""

import asyncio
import json
import re

import pytest

from server.api.errors import APIError
from server.api.grammar_spec import GrammarSpec, json_schema_spec
from server.api.structured_output import MAX_GRAMMAR_CHARS, GrammarCompiler
from server.engine.async_engine import AsyncEngine
from server.engine.request import SamplingParams

PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


@pytest.fixture(scope="module")
def compiler(engine):
    grammars = GrammarCompiler(AsyncEngine(engine))
    yield grammars
    grammars.shutdown()


def compile_spec(compiler: GrammarCompiler, spec: GrammarSpec):
    return asyncio.run(compiler.compile(spec))


def run(engine, requests) -> dict[str, str]:
    for request in requests:
        engine.add_request(request)
    texts, batch_sizes = {}, []
    while engine.has_unfinished_requests():
        batch_sizes.append(len(engine.scheduler.running) + len(engine.scheduler.waiting))
        for output in engine.step():
            if output.finished:
                texts[output.request_id] = output.outputs[0].text
    assert engine.scheduler.block_manager.num_free_blocks == engine.scheduler.block_manager.num_blocks
    return texts


def test_constrained_and_free_requests_share_the_batch_and_each_follows_its_own_grammar(engine, compiler):
    phone = compile_spec(compiler, GrammarSpec("regex", PHONE, "guided_regex"))
    choice = compile_spec(compiler, GrammarSpec("choice", json.dumps(["red", "green", "blue"]), "guided_choice"))
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}}, "required": ["n", "ok"],
              "additionalProperties": False}
    person = compile_spec(compiler, json_schema_spec(schema, "response_format"))
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=40)
    requests = [
        engine.make_request("phone", "Call me at", params, constraint=phone.new_constraint()),
        engine.make_request("colour", "My favourite colour:", params, constraint=choice.new_constraint()),
        engine.make_request("json", "Data:", params, constraint=person.new_constraint()),
        engine.make_request("json-2", "More data:", params, constraint=person.new_constraint()),
        engine.make_request("free", "Anything at all", SamplingParams(temperature=1.0, seed=4, max_tokens=40)),
    ]
    texts = run(engine, requests)
    assert re.fullmatch(PHONE, texts["phone"])
    assert texts["colour"] in ("red", "green", "blue")
    for name in ("json", "json-2"):
        value = json.loads(texts[name])
        assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 99
    assert not re.fullmatch(PHONE, texts["free"])  # the random model, left free, writes no phone number


def test_a_grammar_that_completes_ends_the_request_at_once(engine, compiler):
    yes = compile_spec(compiler, GrammarSpec("regex", "yes", "guided_regex"))
    request = engine.make_request("yes", "Say yes", SamplingParams(temperature=1.0, seed=0, max_tokens=30,
                                                                   ignore_eos=True), constraint=yes.new_constraint())
    assert run(engine, [request]) == {"yes": "yes"}
    assert request.status.value == "stop" and len(request.output_token_ids) == 1


BAD = {
    "regex": (GrammarSpec("regex", "a(b", "guided_regex"), "guided_regex"),
    "schema type": (json_schema_spec({"type": "wat"}, "response_format"), "response_format"),
    "schema reference": (json_schema_spec({"$ref": "#/nowhere"}, "guided_json"), "guided_json"),
    "lark": (GrammarSpec("grammar", "start: missing_rule", "guided_grammar"), "guided_grammar"),
    "gbnf": (GrammarSpec("grammar", 'root ::= "a" (', "guided_grammar"), "guided_grammar"),
}


@pytest.mark.parametrize("spec, param", BAD.values(), ids=BAD.keys())
def test_a_bad_grammar_is_a_400_naming_its_field(compiler, spec, param):
    with pytest.raises(APIError) as error:
        compile_spec(compiler, spec)
    assert error.value.status == 400 and error.value.param == param


def test_a_gbnf_grammar_is_read_as_well_as_lark(engine, compiler):
    digits = compile_spec(compiler, GrammarSpec("grammar", 'root ::= "id-" [0-9] [0-9] [0-9]', "guided_grammar"))
    request = engine.make_request("gbnf", "Your id:", SamplingParams(temperature=1.0, seed=1, max_tokens=20),
                                  constraint=digits.new_constraint())
    assert re.fullmatch(r"id-\d{3}", run(engine, [request])["gbnf"])


def big_schema(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "[a-z]{3,7}[0-9]+"}
                                             for i in range(properties)}}


def test_a_grammar_over_the_size_bound_is_refused_unread(compiler):
    spec = json_schema_spec(big_schema(5000), "response_format")
    assert len(spec.source) > MAX_GRAMMAR_CHARS
    with pytest.raises(APIError, match="characters long") as error:
        compile_spec(compiler, spec)
    assert error.value.param == "response_format"


def test_a_grammar_slower_to_compile_than_the_bound_is_a_400(engine):
    impatient = GrammarCompiler(AsyncEngine(engine))
    try:
        asyncio.run(impatient.compile(GrammarSpec("regex", "warm", "guided_regex")))  # builds its tokenizer
        impatient.timeout_s = 0.01
        with pytest.raises(APIError, match="took longer than") as error:
            asyncio.run(impatient.compile(json_schema_spec(big_schema(3000), "guided_json")))
        assert error.value.status == 400 and error.value.param == "guided_json"
    finally:
        impatient.shutdown()
