"""Bad input gets a 4xx in OpenAI's error shape, never a 500; afterwards the server is healthy and every KV
block is free. Many of these cases crashed vLLM, SGLang or TGI at some point."""

import json

import httpx
import pytest

from server.api import json_text
from tests.api_server import shared_server

pytestmark = pytest.mark.server

MODEL = "smollm"
VOCAB_SIZE = 49152
MAX_MODEL_LEN = 1024  # tests.api_server.FAST_ENGINE_ARGS
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
OK_MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def completion(**fields):
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **fields}


def chat(**fields):
    return {"model": MODEL, "messages": OK_MESSAGES, "max_tokens": 2, **fields}


def post_json(http: httpx.Client, path: str, body: object) -> httpx.Response:
    """Like ``json=``, but ASCII-escaped, so that a lone surrogate can be sent as ``\\ud800``."""
    return http.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


BAD_COMPLETIONS = {
    "empty prompt": (completion(prompt=""), "prompt"),
    "empty prompt list": (completion(prompt=[]), "prompt"),
    "empty token list in a batch": (completion(prompt=[[]]), "prompt"),
    "negative token id": (completion(prompt=[1, -1]), "prompt"),
    "token id == vocab size": (completion(prompt=[VOCAB_SIZE]), "prompt"),
    "huge token id": (completion(prompt=[2**70]), "prompt"),
    "too many stop strings": (completion(stop=[f"s{i}" for i in range(17)]), "stop"),
    "empty stop string": (completion(stop=[""]), "stop"),
    "overlong stop string": (completion(stop=["x" * 300]), "stop"),
    "stop token id negative": (completion(stop_token_ids=[-1]), "stop_token_ids"),
    "stop token id == vocab size": (completion(stop_token_ids=[VOCAB_SIZE]), "stop_token_ids"),
    "too many stop token ids": (completion(stop_token_ids=list(range(65))), "stop_token_ids"),
    "max_tokens 0": (completion(max_tokens=0), "max_tokens"),
    "max_tokens negative": (completion(max_tokens=-5), "max_tokens"),
    "max_tokens beyond the context": (completion(max_tokens=MAX_MODEL_LEN + 1), "max_tokens"),
    "max_tokens astronomically large": (completion(max_tokens=10**30), "max_tokens"),
    "prompt + max_tokens over max-model-len": (completion(prompt=[100] * 1000, max_tokens=100), "max_tokens"),
    "prompt alone over max-model-len": (completion(prompt=[100] * (MAX_MODEL_LEN + 5)), "prompt"),
    "temperature below 0": (completion(temperature=-0.5), "temperature"),
    "top_p below 0": (completion(top_p=-0.1), "top_p"),
    "top_p above 1": (completion(top_p=1.5), "top_p"),
    "huge n": (completion(n=10**6), "n"),
    "n 0": (completion(n=0), "n"),
    "too many choices in all": (completion(prompt=["a"] * 40, n=2), "n"),
    "top_k below -1": (completion(top_k=-2), "top_k"),
    "presence_penalty out of range": (completion(presence_penalty=3.0), "presence_penalty"),
    "frequency_penalty out of range": (completion(frequency_penalty=-3.0), "frequency_penalty"),
    "repetition_penalty 0": (completion(repetition_penalty=0.0), "repetition_penalty"),
    "repetition_penalty that would overflow the logits": (completion(repetition_penalty=1e-300), "repetition_penalty"),
    "seed beyond int64": (completion(seed=2**64), "seed"),
    "suffix is not supported": (completion(suffix="x"), "suffix"),
    "too many prompts": (completion(prompt=["a"] * 65), "prompt"),
    "logprobs above the bound": (completion(logprobs=21), "logprobs"),
    "negative logprobs": (completion(logprobs=-1), "logprobs"),
    "logit_bias token id == vocab size": (completion(logit_bias={str(VOCAB_SIZE): 1.0}), "logit_bias"),
    "logit_bias negative token id": (completion(logit_bias={"-1": 1.0}), "logit_bias"),
    "logit_bias key not a token id": (completion(logit_bias={"hello": 1.0}), "logit_bias"),
    "logit_bias value above 100": (completion(logit_bias={"42": 101.0}), "logit_bias"),
    "invalid regex": (completion(guided_regex="a(b"), "guided_regex"),
    "invalid JSON schema": (completion(guided_json={"type": "wat"}), "guided_json"),
    "JSON schema that is not JSON": (completion(guided_json="{not json"), "guided_json"),
    "invalid grammar": (completion(guided_grammar="start: nowhere"), "guided_grammar"),
    "empty choice list": (completion(guided_choice=[]), "guided_choice"),
    "invalid structured_outputs regex": (completion(structured_outputs={"regex": "(("}), "structured_outputs"),
    "two constraints at once": (completion(guided_regex="a+", guided_choice=["a"]), "guided_choice"),
    # Nested past Python's recursive JSON parser: a 500 (RecursionError) before.
    "guided_json text 3,000 arrays deep": (completion(guided_json="[" * 3000 + "]" * 3000), "guided_json"),
    "guided_json text 100,000 arrays deep": (completion(guided_json="[" * 100_000 + "]" * 100_000), "guided_json"),
    "structured_outputs.json text 3,000 deep": (completion(structured_outputs={"json": "[" * 3000 + "]" * 3000}),
                                                "structured_outputs"),
}

WRONG_TYPES = {
    "model": 5, "prompt": {"text": "hi"}, "max_tokens": "5", "temperature": "hot", "top_p": [1],
    "top_k": 1.5, "n": True, "stop": 5, "stop_token_ids": ["a"], "seed": "1", "presence_penalty": {},
    "frequency_penalty": "0", "repetition_penalty": [], "ignore_eos": "yes", "user": 5, "stream": "true",
    "stream_options": "usage", "echo": 1, "logprobs": "x", "suffix": 3, "best_of": "2",
}

BAD_CHATS = {
    "empty message list": (chat(messages=[]), "messages"),
    "messages not a list": (chat(messages="hi"), "messages"),
    "message not an object": (chat(messages=[5]), "messages"),
    "unknown role": (chat(messages=[{"role": "wizard", "content": "x"}]), "messages"),
    "missing role": (chat(messages=[{"content": "x"}]), "messages"),
    "content of the wrong type": (chat(messages=[{"role": "user", "content": 5}]), "messages"),
    "non-text content part": (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages"),
    "lone surrogate in content": (chat(messages=[{"role": "user", "content": "a\ud800b"}]), "messages"),
    "max_completion_tokens of the wrong type": (chat(max_completion_tokens="x"), "max_completion_tokens"),
    "max_completion_tokens 0": (chat(max_completion_tokens=0), "max_completion_tokens"),
    "user message without content": (chat(messages=[{"role": "user"}]), "messages"),
    "system message without content": (chat(messages=[{"role": "system"}, *OK_MESSAGES]), "messages"),
    "user message with null content": (chat(messages=[{"role": "user", "content": None}]), "messages"),
    "assistant message with neither content nor tool calls": (
        chat(messages=[*OK_MESSAGES, {"role": "assistant"}, *OK_MESSAGES]), "messages"),
    "temperature below 0": (chat(temperature=-1), "temperature"),
    "top_logprobs above the bound": (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    "top_logprobs without logprobs": (chat(top_logprobs=2), "top_logprobs"),
    "logit_bias outside the vocabulary": (chat(logit_bias={str(VOCAB_SIZE + 7): -5}), "logit_bias"),
    "json_schema without a schema": (chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
                                     "response_format"),
    "invalid JSON schema": (chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": 5}}}), "response_format"),
    "unknown response_format type": (chat(response_format={"type": "yaml"}), "response_format"),
    "a tool without a function": (chat(tools=[{"type": "function"}]), "tools"),
    "a tool name with spaces": (chat(tools=[{"type": "function", "function": {"name": "get weather"}}]), "tools"),
    "tool_choice naming an unknown tool": (
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    "tool_choice required without tools": (chat(tool_choice="required"), "tool_choice"),
    "tool with an invalid parameters schema": (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
             tool_choice="required"), "tools"),
    "response_format and a forced tool call at once": (
        chat(tools=[TOOL], tool_choice="required", response_format={"type": "json_object"}), "response_format"),
}


@pytest.mark.parametrize("body, param", BAD_COMPLETIONS.values(), ids=BAD_COMPLETIONS.keys())
def test_bad_completion_fields_are_400(http, body, param):
    assert_openai_error(post_json(http, COMPLETIONS, body), 400, param)


@pytest.mark.parametrize("field, value", WRONG_TYPES.items(), ids=WRONG_TYPES.keys())
def test_a_wrong_type_in_any_field_is_400_not_422(http, field, value):
    assert_openai_error(http.post(COMPLETIONS, json=completion(**{field: value})), 400, field)


@pytest.mark.parametrize("body, param", BAD_CHATS.values(), ids=BAD_CHATS.keys())
def test_bad_chat_requests_are_400(http, body, param):
    assert_openai_error(post_json(http, CHAT, body), 400, param)


RAW_BODIES = {
    "malformed JSON": b'{"prompt": "Hello", "max_tokens": ',
    "JSON array body": b"[1, 2]",
    "JSON string body": b'"Hello"',
    "JSON number body": b"5",
    "JSON null body": b"null",
    "empty body": b"",
    "invalid UTF-8": b'{"model": "smollm", "prompt": "\xff\xfe\xfd", "max_tokens": 2}',
    "lone surrogate escape": b'{"model": "smollm", "prompt": "\\ud800", "max_tokens": 2}',
    "lone surrogate in stop": b'{"model": "smollm", "prompt": "a", "stop": ["\\udfff"], "max_tokens": 2}',
    "lone surrogate in model": b'{"model": "\\ud800", "prompt": "a", "max_tokens": 2}',
    "lone surrogate in user": b'{"model": "smollm", "prompt": "a", "user": "\\ud800", "max_tokens": 2}',
    "NaN temperature": b'{"model": "smollm", "prompt": "a", "temperature": NaN}',
    "infinite top_p": b'{"model": "smollm", "prompt": "a", "top_p": Infinity}',
    "overflowing float literal": b'{"model": "smollm", "prompt": "a", "temperature": 1e400}',
    "deeply nested JSON": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("raw", RAW_BODIES.values(), ids=RAW_BODIES.keys())
def test_unparseable_or_non_object_bodies_are_400(http, raw):
    assert_openai_error(http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize("depth", [3000, 100_000])
def test_tool_call_arguments_nested_past_the_parser_are_read_as_text(http, depth):
    """A 500 (RecursionError) before; now the arguments reach the template as the text they are."""
    call = {"id": "call-1", "type": "function", "function": {"name": "f", "arguments": "[" * depth + "]" * depth}}
    messages = [*OK_MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1", "content": "ok"}]
    response = post_json(http, CHAT, chat(messages=messages))
    assert response.status_code in (200, 400), response.text
    assert http.get("/livez").status_code == 200


def test_json_text_nested_past_the_parser_is_malformed_json():
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        json_text.loads("[" * 100_000 + "]" * 100_000)
    assert json_text.loads('{"a": [[1]]}') == {"a": [[1]]}


def test_a_body_that_is_not_json_at_all_is_400(http):
    response = http.post(COMPLETIONS, content=b"prompt=Hello", headers={"content-type": "text/plain"})
    assert_openai_error(response, 400)


def test_an_unknown_model_is_404(http):
    for path, body in ((COMPLETIONS, completion(model="gpt-17")), (CHAT, chat(model="gpt-17"))):
        assert assert_openai_error(http.post(path, json=body), 404, "model")["code"] == "model_not_found"
    assert_openai_error(http.get("/v1/models/gpt-17"), 404, "model")


def test_an_oversized_body_is_413_whether_declared_or_streamed(http):
    big = json.dumps(completion(prompt="a" * (5 * 2**20))).encode()
    assert_openai_error(http.post(COMPLETIONS, content=big, headers={"content-type": "application/json"}), 413)

    def chunked():  # no Content-Length: the limit must hold as the bytes arrive
        for start in range(0, len(big), 2**16):
            yield big[start : start + 2**16]

    assert_openai_error(http.post(COMPLETIONS, content=chunked(), headers={"content-type": "application/json"}), 413)


def test_oversized_headers_are_refused_with_a_4xx(http):
    response = http.post(COMPLETIONS, json=completion(), headers={"x-padding": "p" * 40_000})
    assert_openai_error(response, 431)
    # Far past the limit, the HTTP parser refuses to buffer more before the app ever sees a request.
    huge = http.post(COMPLETIONS, json=completion(), headers={f"x-padding-{i}": "p" * 8000 for i in range(200)})
    assert huge.status_code == 400 and huge.json()["error"]["type"] == "invalid_request_error"
    assert http.get("/livez").status_code == 200


def test_wrong_method_and_unknown_route_are_openai_errors(http):
    assert_openai_error(http.get(COMPLETIONS), 405)
    assert_openai_error(http.post("/v1/embeddings", json={}), 404)


def test_extreme_but_valid_sampling_values_do_not_hurt_the_engine(http):
    # Passed straight to the sampler, the first three kill the engine loop (float32 makes inf, NaN or an empty mask).
    for fields in ({"temperature": 1e-300}, {"top_p": 1e-300}, {"top_p": 5e-324, "temperature": 0.5},
                   {"repetition_penalty": 0.01, "temperature": 1.0}, {"temperature": 1e300}, {"top_k": 2**40},
                   {"seed": -(2**63)}, {"seed": 2**63 - 1, "n": 3, "temperature": 1.0},
                   {"repetition_penalty": 10.0, "presence_penalty": -2.0, "frequency_penalty": 2.0}):
        response = http.post(COMPLETIONS, json=completion(**fields))
        assert response.status_code == 200, (fields, response.text)
    assert http.get("/livez").status_code == 200


def test_unknown_fields_are_ignored(http):
    response = http.post(COMPLETIONS, json=completion(frobnicate={"deep": [1, 2]}, logit_bias=None, metadata=3))
    assert response.status_code == 200, response.text


def test_request_ids_are_echoed_or_made_up(http):
    assert http.get("/livez", headers={"x-request-id": "my-id-42"}).headers["x-request-id"] == "my-id-42"
    made_up = http.get("/livez", headers={"x-request-id": "x" * 500}).headers["x-request-id"]
    assert made_up and made_up != "x" * 500
    assert http.post(COMPLETIONS, json=completion(max_tokens=0)).headers["x-request-id"]


def test_a_schema_too_large_to_compile_quickly_is_refused_by_its_size(http):
    # 30,000 patterned properties: about 2 MB, several seconds of compiling. Refused unread, with a 400.
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": "[a-z]{3,7}[0-9]+"}
                                               for i in range(30_000)}}
    response = http.post(CHAT, json=chat(response_format={"type": "json_schema",
                                                          "json_schema": {"name": "huge", "schema": schema}}))
    assert "characters long" in assert_openai_error(response, 400, "response_format")["message"]


def test_bad_tokenizer_requests_are_400(http):
    assert_openai_error(http.post("/tokenize", json={"model": MODEL}), 400, "prompt")
    assert_openai_error(http.post("/tokenize", json={"prompt": "a", "messages": OK_MESSAGES}), 400, "prompt")
    assert_openai_error(http.post("/tokenize", json={"messages": [{"role": "user"}]}), 400, "messages")
    assert_openai_error(http.post("/detokenize", json={"tokens": [VOCAB_SIZE]}), 400, "tokens")
    assert_openai_error(http.post("/detokenize", json={"tokens": "abc"}), 400, "tokens")
    too_many = assert_openai_error(http.post("/detokenize", json={"tokens": [1] * (MAX_MODEL_LEN + 1)}), 400, "tokens")
    assert too_many["code"] == "context_length_exceeded"


# Under the character bound (1,024 tokens x 81 characters, the longest token's) but some 16,000 tokens: counted a
# chunk at a time and refused once past the context, where it was tokenized whole before (130k tokens at 8,192).
FAR_PAST_THE_CONTEXT = ("the quick brown fox jumps over the lazy dog " * 2000)[:80_000]


@pytest.mark.parametrize("path, body", [
    ("/tokenize", {"prompt": FAR_PAST_THE_CONTEXT}),
    ("/tokenize", {"messages": [{"role": "user", "content": FAR_PAST_THE_CONTEXT}]}),
    (COMPLETIONS, completion(prompt=FAR_PAST_THE_CONTEXT)),
    (CHAT, chat(messages=[{"role": "user", "content": FAR_PAST_THE_CONTEXT}])),
], ids=["tokenize prompt", "tokenize messages", "completion", "chat"])
def test_a_text_far_past_the_context_is_refused_without_tokenizing_it_whole(http, path, body):
    error = assert_openai_error(http.post(path, json=body), 400)
    assert error["code"] == "context_length_exceeded" and "maximum context length is 1024" in error["message"]
    assert f"more than {MAX_MODEL_LEN} tokens" in error["message"]


def test_the_server_is_healthy_with_every_block_free_after_all_that(server, http):
    # Runs last in this module (pytest keeps file order).
    assert http.get("/livez").status_code == 200
    assert http.get("/readyz").status_code == 200
    server.wait_all_blocks_free(timeout=10)
    assert http.post(COMPLETIONS, json=completion()).status_code == 200
