"""The official ``openai`` package against the real server on 127.0.0.1."""

import httpx
import openai
import pytest

from server.models.tokenizer import Tokenizer
from tests.api_server import shared_server

pytestmark = pytest.mark.server

MODEL = "smollm"
PROMPT = "The capital of France is"
GREEDY = {"temperature": 0.0}
IGNORE_EOS = {"extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(smollm_folder):
    return Tokenizer.from_folder(smollm_folder)


def test_completion_returns_text_and_exact_usage(client, tokenizer):
    result = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, **GREEDY, **IGNORE_EOS)
    choice = result.choices[0]
    assert result.object == "text_completion" and result.model == MODEL
    assert choice.text and choice.finish_reason == "length"
    assert result.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert result.usage.completion_tokens == 6
    assert result.usage.total_tokens == result.usage.prompt_tokens + 6


def test_token_id_prompts_and_prompt_lists_count_every_prompt(client, tokenizer):
    ids = tokenizer.encode(PROMPT)
    by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, **GREEDY)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=MODEL, prompt=[PROMPT, "One, two, three,"], max_tokens=3, **GREEDY,
                                      **IGNORE_EOS)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text[: len(batch.choices[0].text)]
    assert batch.usage.prompt_tokens == len(ids) + len(tokenizer.encode("One, two, three,"))
    assert batch.usage.completion_tokens == 6


def test_chat_applies_the_template_and_counts_its_tokens(client, tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    result = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, **GREEDY, **IGNORE_EOS)
    choice = result.choices[0]
    assert result.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert "Paris" in choice.message.content
    templated = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert result.usage.prompt_tokens == len(tokenizer.encode(templated, add_special_tokens=False))
    assert result.usage.completion_tokens == 8


def test_streamed_completion_matches_the_unstreamed_one_and_reports_usage(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, **GREEDY, **IGNORE_EOS)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY, **IGNORE_EOS))
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) > 1
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_chat_sends_the_role_first_then_content(client):
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, **GREEDY)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_the_raw_stream_is_sse_ending_with_done(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True, **GREEDY}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]" and events.count("data: [DONE]") == 1


def test_n_choices_are_indexed_distinct_and_all_counted(client):
    result = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0,
                                       seed=7, **IGNORE_EOS)
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert len({c.text for c in result.choices}) > 1
    assert result.usage.completion_tokens == 24
    streamed = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=3,
                                              temperature=1.0, seed=7, stream=True, **IGNORE_EOS))
    texts = ["".join(c.choices[0].text for c in streamed if c.choices[0].index == i) for i in range(3)]
    assert texts == [c.text for c in sorted(result.choices, key=lambda c: c.index)]


def test_a_seed_reproduces_a_sampled_completion(client):
    def sample(seed: int) -> str:
        return client.completions.create(model=MODEL, prompt="My favourite colour is", max_tokens=10,
                                         temperature=1.0, seed=seed, **IGNORE_EOS).choices[0].text

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(seed) != first for seed in (1, 2, 3))


def test_stop_strings_cut_the_text_and_are_reported(client):
    full = client.completions.create(model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=12, **GREEDY, **IGNORE_EOS)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"no usable stop string in {text!r}"
    for stream in (False, True):
        result = client.completions.create(model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=12, stop=[stop, "zzz"],
                                           stream=stream, **GREEDY, **IGNORE_EOS)
        chunks = list(result) if stream else [result]
        got = "".join(c.choices[0].text for c in chunks)
        assert got == text[: text.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].choices[0].stop_reason == stop


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_errors_map_to_the_clients_exception_types(client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert bad.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=1)
