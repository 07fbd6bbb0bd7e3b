"""OpenAI's behaviour where clients depend on it, against the real server on 127.0.0.1: the error codes, types and
params they act on, ``top_p: 0``, ``max_tokens: null``, legacy ``functions``, refusal parts, and ``tools`` with
``response_format`` under ``tool_choice: auto``."""

import json

import httpx
import jsonschema
import openai
import pytest

from tests.api_server import FAST_ENGINE_ARGS, shared_server

pytestmark = pytest.mark.server

MODEL = "smollm"
MAX_MODEL_LEN = int(FAST_ENGINE_ARGS[FAST_ENGINE_ARGS.index("--max-model-len") + 1])
TOO_LONG = "hello " * (MAX_MODEL_LEN + 200)
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                      "required": ["city"], "additionalProperties": False}
GET_WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_PARAMETERS}
ANSWER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                  "summary": {"type": "string", "maxLength": 60}},
                 "required": ["city", "summary"], "additionalProperties": False}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": ANSWER_SCHEMA}}


@pytest.fixture(scope="module")
def http(smollm_folder):
    with httpx.Client(base_url=shared_server(smollm_folder).base_url, timeout=120) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
    ("/v1/completions", {"prompt": TOO_LONG}, "prompt"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": MAX_MODEL_LEN}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": MAX_MODEL_LEN},
     "max_tokens"),
], ids=["chat prompt", "completion prompt", "completion max_tokens", "chat max_tokens"])
def test_an_overflowing_context_is_context_length_exceeded_naming_the_requests_own_field(http, path, body, param):
    error = error_of(http.post(path, json={"model": MODEL, **body}), 400)
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]


def test_an_unknown_model_is_model_not_found_with_openais_type(http):
    error = error_of(http.post("/v1/completions", json={"model": "no-such-model", "prompt": "Hi"}), 404)
    assert (error["code"], error["type"], error["param"]) == ("model_not_found", "invalid_request_error", "model")
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", max_retries=0).models.retrieve("nope")


def test_top_p_zero_is_greedy(http):
    def text(**fields: object) -> str:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, **fields}
        return http.post("/v1/completions", json=body).json()["choices"][0]["text"]

    greedy = text(temperature=0.0)
    assert text(top_p=0.0, temperature=1.0, seed=1) == text(top_p=0.0, temperature=1.0, seed=2) == greedy


def test_a_null_max_tokens_is_the_completions_default_of_16(http):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": None, "ignore_eos": True}
    assert http.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 16


def test_legacy_functions_are_served_and_answered_with_a_function_call(http):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": MODEL, "messages": messages, "functions": [GET_WEATHER], "function_call": {"name": "get_weather"},
            "max_tokens": 40, "temperature": 0.0}
    answer = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert answer["finish_reason"] == "function_call" and "tool_calls" not in answer["message"]
    call = answer["message"]["function_call"]
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_PARAMETERS)

    streamed, names, reasons = "", [], []
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            for choice in json.loads(line[6:])["choices"] if line.startswith("data: {") else []:
                delta = choice["delta"].get("function_call") or {}
                names += [delta["name"]] if "name" in delta else []
                streamed += delta.get("arguments") or ""
                reasons += [choice["finish_reason"]] if choice["finish_reason"] else []
    assert names == ["get_weather"] and json.loads(streamed) == json.loads(call["arguments"])
    assert reasons == ["function_call"]

    # The call and its result go back as legacy messages, and the model answers.
    history = [*messages, {"role": "assistant", "content": None, "function_call": call},
               {"role": "function", "name": "get_weather", "content": '{"sky": "sunny"}'}]
    follow_up = {"model": MODEL, "messages": history, "functions": [GET_WEATHER], "max_tokens": 8}
    assert http.post("/v1/chat/completions", json=follow_up).status_code == 200


def test_functions_with_tools_or_a_function_call_without_functions_are_400(http):
    hi = [{"role": "user", "content": "Hi"}]
    both = {"messages": hi, "functions": [GET_WEATHER], "tools": [{"type": "function", "function": GET_WEATHER}]}
    assert "not both" in error_of(http.post("/v1/chat/completions", json=both), 400)["message"]
    alone = {"messages": hi, "function_call": "auto"}
    assert error_of(http.post("/v1/chat/completions", json=alone), 400)["param"] == "function_call"


def test_assistant_refusals_are_accepted_as_parts_and_as_the_refusal_field(http):
    messages = [
        {"role": "user", "content": "Tell me a secret."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't share that."}]},
        {"role": "user", "content": "Then a fact."},
        {"role": "assistant", "content": None, "refusal": "I'd rather not."},
        {"role": "user", "content": "Please?"},
    ]
    answer = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 4})
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["role"] == "assistant"


def weather_request(question: str) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0.0,
            "tools": [{"type": "function", "function": GET_WEATHER}], "response_format": ANSWER_FORMAT,
            "parallel_tool_calls": False, "max_tokens": 60}


def test_tools_with_a_response_format_under_auto_may_call_a_tool_or_answer_in_the_format(http):
    # What openai-agents sends for Agent(tools=..., output_type=...): the format binds only the final answer.
    called = http.post("/v1/chat/completions", json=weather_request("Weather in Paris?")).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls"
    (call,) = called["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_PARAMETERS)

    answered = http.post("/v1/chat/completions", json=weather_request("Write a JSON object about London.")).json()
    message = answered["choices"][0]["message"]
    assert "tool_calls" not in message and answered["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(message["content"]), ANSWER_SCHEMA)


def test_tools_with_a_non_json_format_under_auto_are_refused_as_unsupported(http):
    body = {**weather_request("Hi"), "response_format": None, "guided_regex": "[a-z]+"}
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert (error["code"], error["param"]) == ("unsupported", "guided_regex")
