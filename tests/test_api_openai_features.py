"""Logprobs, echo, structured output, tool calls and the tokenizer routes, through the official ``openai`` package
against the real server; JSON checked with ``jsonschema``."""

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.api_server import shared_server

pytestmark = pytest.mark.server

MODEL = "smollm"
GREEDY = {"temperature": 0.0}
# The same tokens computed again, in another batch and partly from the prefix cache, round differently in the
# server's fp16 KV cache: logprobs agree this closely, not bit for bit.
RECOMPUTED = 2e-3
PROMPT = "The capital of France is"
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": WEATHER_PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


# --- logprobs -------------------------------------------------------------------------------------------------


def test_completion_logprobs_have_openai_shape(client):
    choice = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=3, **GREEDY).choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert logprob <= 0 and 3 <= len(top) <= 4 and top[token] == logprob
        assert logprob == max(top.values())  # greedy: the chosen token is the most likely


def test_echo_scores_the_prompt_with_the_logprobs_generation_would_give(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, logprobs=1, **GREEDY).choices[0]
    echoed = client.completions.create(model=MODEL, prompt=PROMPT + plain.text, max_tokens=1, logprobs=1, echo=True,
                                       **GREEDY).choices[0]
    logprobs = echoed.logprobs
    assert echoed.text.startswith(PROMPT + plain.text)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert "".join(logprobs.tokens[:-1]) == PROMPT + plain.text and logprobs.text_offset[0] == 0
    # The prompt's last token, scored as part of the prompt, against the same token sampled after the prompt.
    assert logprobs.tokens[-2] == plain.logprobs.tokens[0]
    assert logprobs.token_logprobs[-2] == pytest.approx(plain.logprobs.token_logprobs[0], abs=RECOMPUTED)


def test_streamed_completion_logprobs_add_up_to_the_unstreamed_ones(client):
    fields = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "logprobs": 2, "echo": True, **GREEDY}
    whole = client.completions.create(**fields).choices[0].logprobs
    tokens, values, offsets = [], [], []
    for chunk in client.completions.create(stream=True, **fields):
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            values += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert tokens == whole.tokens and offsets == whole.text_offset
    assert values[0] is None and values[1:] == pytest.approx(whole.token_logprobs[1:], abs=RECOMPUTED)


def test_chat_logprobs_streamed_and_unstreamed(client):
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 6,
              "logprobs": True, "top_logprobs": 2, **GREEDY}
    response = client.chat.completions.create(**fields).choices[0]
    content = response.logprobs.content
    assert "".join(entry.token for entry in content) == response.message.content
    for entry in content:
        assert bytes(entry.bytes).decode() == entry.token and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob == entry.logprob >= entry.top_logprobs[1].logprob
    streamed = [entry for chunk in client.chat.completions.create(stream=True, **fields)
                if chunk.choices and chunk.choices[0].logprobs for entry in chunk.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=RECOMPUTED)


# --- structured output ----------------------------------------------------------------------------------------


class City(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population_millions: int
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]


def test_chat_completions_parse_fills_a_pydantic_model(client):
    result = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}],
                                           response_format=City, max_tokens=80, **GREEDY)
    choice = result.choices[0]
    assert isinstance(choice.message.parsed, City) and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), City.model_json_schema())


def test_every_sampled_choice_follows_the_schema(client):
    schema = {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "rating": {"type": "number", "minimum": 0, "maximum": 5}}, "required": ["title", "tags", "rating"],
        "additionalProperties": False}
    result = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Review a film as JSON."}], max_tokens=120, n=3,
        temperature=1.0, seed=7, response_format={"type": "json_schema", "json_schema": {"name": "review",
                                                                                          "schema": schema}})
    for choice in result.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_answers_with_a_json_object(client):
    content = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A JSON object about a dog."}], max_tokens=60,
        response_format={"type": "json_object"}, **GREEDY).choices[0].message.content
    assert content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(content + "{")  # nothing but the object, so one more character breaks it


VLLM_FIELDS = {
    "guided_choice": ({"guided_choice": ["positive", "negative"]}, r"positive|negative"),
    "guided_regex": ({"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"}, r"\(\d{3}\) \d{3}-\d{4}"),
    "guided_grammar (Lark)": ({"guided_grammar": 'start: "id-" DIGIT DIGIT\nDIGIT: /[0-9]/'}, r"id-\d\d"),
    "guided_grammar (GBNF)": ({"guided_grammar": 'root ::= ("yes" | "no") "!"'}, r"(yes|no)!"),
    "structured_outputs.choice": ({"structured_outputs": {"choice": ["up", "down"]}}, r"up|down"),
    "structured_outputs.regex": ({"structured_outputs": {"regex": "[A-Z]{3}"}}, r"[A-Z]{3}"),
}


@pytest.mark.parametrize("extra, pattern", VLLM_FIELDS.values(), ids=VLLM_FIELDS.keys())
def test_vllm_guided_fields_on_both_endpoints(client, extra, pattern):
    completion = client.completions.create(model=MODEL, prompt="Answer:", max_tokens=20, extra_body=extra, **GREEDY)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Answer."}],
                                          max_tokens=20, extra_body=extra, **GREEDY)
    assert re.fullmatch(pattern, completion.choices[0].text)
    assert re.fullmatch(pattern, chat.choices[0].message.content)


# --- tool calls -----------------------------------------------------------------------------------------------


def streamed_tool_calls(stream) -> tuple[dict[int, dict], str | None]:
    """The SDK's chunks put back together, as an agent framework does: by each call's index."""
    calls: dict[int, dict] = {}
    reason = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or delta.id
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        reason = choice.finish_reason or reason
    return calls, reason


WEATHER_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_required_tool_call_streams_in_openai_deltas(client):
    stream = client.chat.completions.create(model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME],
                                            tool_choice="required", max_tokens=80, stream=True, **GREEDY)
    calls, reason = streamed_tool_calls(stream)
    assert reason == "tool_calls" and calls
    for call in calls.values():
        assert call["id"].startswith("call_")
        schema = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME["function"]["parameters"]}[call["name"]]
        jsonschema.validate(json.loads(call["arguments"]), schema)


def test_a_named_tool_call_streams_its_arguments_as_they_come(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME], max_tokens=60, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **GREEDY)
    chunks = [chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.tool_calls]
    assert len(chunks) > 1  # the arguments arrive in pieces
    calls, _ = streamed_tool_calls(iter(chunks))
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_PARAMETERS)
    unstreamed = client.chat.completions.create(
        model=MODEL, messages=WEATHER_QUESTION, tools=[WEATHER, TIME], max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, **GREEDY).choices[0]
    assert unstreamed.message.content is None and unstreamed.finish_reason == "tool_calls"
    assert unstreamed.message.tool_calls[0].function.arguments == calls[0]["arguments"]


def _call(call_id: str, city: str) -> dict:
    arguments = json.dumps({"city": city})
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}


# Two earlier turns in which the assistant called the tool: past calls render through the template, and the model
# follows them with a call of its own, in its own (Hermes) format, which the parser reads.
HISTORY = [{"role": "user", "content": "Weather in Paris?"}, _call("call_1", "Paris"),
           {"role": "user", "content": "Weather in Rome?"}, _call("call_2", "Rome"),
           {"role": "user", "content": "Weather in London?"}]


def test_auto_reads_the_models_own_tool_call_streamed_and_unstreamed(client):
    fields = {"model": MODEL, "messages": HISTORY, "tools": [WEATHER], "max_tokens": 60, **GREEDY}
    choice = client.chat.completions.create(**fields).choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "London"}
    calls, reason = streamed_tool_calls(client.chat.completions.create(stream=True, **fields))
    assert reason == "tool_calls" and [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("get_weather", call.function.arguments)]


def test_tool_choice_none_answers_in_words(client):
    choice = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=[WEATHER], tool_choice="none",
                                            max_tokens=30, **GREEDY).choices[0]
    assert not choice.message.tool_calls and choice.message.content and choice.finish_reason != "tool_calls"


def test_past_calls_and_tool_results_render_through_the_template(http):
    messages = [*HISTORY[:2], {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    response = http.post("/tokenize", json={"messages": messages, "tools": [WEATHER]})
    assert response.status_code == 200, response.text
    text = http.post("/detokenize", json={"tokens": response.json()["tokens"]}).json()["prompt"]
    assert '"name": "get_weather"' in text and "<tools>" in text  # the tools offered in the system message
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text


# --- tokenizer routes -----------------------------------------------------------------------------------------


def test_tokenize_and_detokenize_round_trip(http, client):
    tokens = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 1024
    assert "".join(tokens["token_strs"]) == PROMPT
    usage = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1).usage
    assert usage.prompt_tokens == tokens["count"]
    assert http.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": PROMPT}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=1).usage.prompt_tokens == chat["count"]


def test_version_and_tokenizer_info(http):
    assert http.get("/version").json()["version"]
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]


def test_every_block_is_free_afterwards(server):
    server.wait_all_blocks_free(timeout=10)
