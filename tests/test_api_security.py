"""API keys, per-tenant rate limits and the body limit: the pieces alone, then on a real server."""

import asyncio
import re

import httpx
import openai
import pytest

from server.api.auth.api_keys import APIKeys
from server.api.auth.authenticator import Authenticator
from server.api.auth.caller import ANONYMOUS
from server.api.errors import APIError
from server.api.rate_limits import RateLimiter, go_duration
from tests.api_server import APIServer

MODEL = "smollm"
KEY_FLAG, KEY_FLAG_2, KEY_FILE = "key-from-flag", "second-key-from-flag", "key-from-file"
KEY_FLAG_3 = "third-key-from-flag"  # only the tokenizer and models routes' limit test spends it
KEY_ENV, KEY_ENV_2 = "key-from-env", "other-key-from-env"
RPM, TPM = 6, 100
MAX_REQUEST_BYTES = 64 * 1024


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the pieces -----------------------------------------------------------------------------------------


def test_keys_are_checked_by_digest_and_identify_the_caller():
    authenticator = Authenticator(APIKeys(["alpha", "beta"]))

    def identify(*headers: str):
        return asyncio.run(authenticator.identify(list(headers)))

    alpha, beta = identify("Bearer alpha"), identify("bearer beta")
    assert alpha != beta and "alpha" not in alpha.tenant
    for headers in ((), ("",), ("Bearer",), ("Bearer gamma",), ("Basic alpha",), ("alpha",), ("Bearer alph",),
                    ("Bearer \xe9\xff",), ("Bearer a.b.c",)):
        with pytest.raises(APIError) as refused:
            identify(*headers)
        assert refused.value.status == 401, headers
    with pytest.raises(APIError) as twice:
        identify("Bearer alpha", "Bearer alpha")
    assert twice.value.status == 400 and twice.value.code == "duplicate_authorization"
    assert asyncio.run(Authenticator(APIKeys([])).identify([])) == ANONYMOUS


def test_requests_per_minute_refill_over_time_and_say_when_to_retry():
    clock = FakeClock()
    limiter = RateLimiter(rpm=2, tpm=None, clock=clock)
    limiter.admit_request("a")
    limiter.admit_request("a")
    with pytest.raises(APIError) as limited:
        limiter.admit_request("a")
    assert limited.value.status == 429 and limited.value.headers["Retry-After"] == "30"
    limiter.admit_request("b")  # another key has its own budget
    clock.now += 30
    limiter.admit_request("a")


def test_the_rate_limit_headers_say_the_limit_what_is_left_and_when_it_is_whole_again():
    clock = FakeClock()
    limiter = RateLimiter(rpm=6, tpm=600, clock=clock)
    assert limiter.headers("a") == {
        "x-ratelimit-limit-requests": "6", "x-ratelimit-remaining-requests": "6", "x-ratelimit-reset-requests": "0ms",
        "x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "600", "x-ratelimit-reset-tokens": "0ms"}
    limiter.admit_request("a")
    limiter.reserve_tokens("a", 450)
    clock.now += 5
    headers = limiter.headers("a")
    # 6 a minute refill one every 10 s: 5 s after the first, half of it is back; 450 tokens at 10 a second: 45 s.
    assert headers["x-ratelimit-remaining-requests"] == "5" and headers["x-ratelimit-reset-requests"] == "5s"
    assert headers["x-ratelimit-remaining-tokens"] == "200" and headers["x-ratelimit-reset-tokens"] == "40s"
    limiter.reserve_tokens("a", 200)
    assert limiter.headers("a")["x-ratelimit-reset-tokens"] == "1m0s"
    assert RateLimiter(None, None).headers("a") == {}
    assert [go_duration(s) for s in (0.02, 1.5, 360, 361.25)] == ["20ms", "1.5s", "6m0s", "6m1.25s"]


def test_tokens_per_minute_reserve_at_admission_and_refund_what_was_not_used():
    clock = FakeClock()
    limiter = RateLimiter(rpm=None, tpm=100, clock=clock)
    first = limiter.reserve_tokens("a", 70)
    with pytest.raises(APIError):
        limiter.reserve_tokens("a", 70)
    first.settle(used=10)  # 60 back
    first.settle(used=0)  # settling twice refunds nothing more
    second = limiter.reserve_tokens("a", 85)
    with pytest.raises(APIError) as limited:
        limiter.reserve_tokens("a", 10)
    assert limited.value.headers["Retry-After"] == "3"  # 90 - 85 = 5 left, 5 short, at 100/60 tokens a second
    second.settle(used=85)
    with pytest.raises(APIError, match="more than the limit") as never:
        limiter.reserve_tokens("b", 101)
    # No minute could ever hold it: a 400 naming the limit, with no Retry-After that could not come true.
    assert never.value.status == 400 and "Retry-After" not in never.value.headers


# --- on a real server -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm_folder, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# one key per line\n{KEY_FILE}\n\n")
    server = APIServer(
        smollm_folder, "--api-key", KEY_FLAG, "--api-key", KEY_FLAG_2, "--api-key", KEY_FLAG_3,
        "--api-key-file", str(key_file),
        "--metrics-require-api-key", "--rate-limit-rpm", str(RPM), "--rate-limit-tpm", str(TPM),
        "--max-request-bytes", str(MAX_REQUEST_BYTES),
        env={"VIGIL_API_KEYS": f"{KEY_ENV}, {KEY_ENV_2}"},
    ).wait_ready()
    yield server
    server.stop()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0.0, **fields}


GUARDED = [("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL}"), ("POST", "/v1/completions"),
           ("POST", "/v1/chat/completions"), ("GET", "/health"), ("GET", "/metrics"), ("GET", "/openapi.json")]


@pytest.mark.server
@pytest.mark.parametrize("method, path", GUARDED, ids=[p for _, p in GUARDED])
def test_every_route_but_the_probes_needs_a_key(server, method, path):
    for headers in ({}, bearer("wrong-key"), {"authorization": "Basic " + KEY_FLAG},
                    {"authorization": b"Bearer \xe9\xff\xfe"}, {"authorization": "Bearer ключ".encode()}):
        response = httpx.request(method, f"{server.base_url}{path}", headers=headers, json=completion(), timeout=30)
        assert response.status_code == 401, (headers, response.text)
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.json()["error"]["type"] == "invalid_request_error"  # OpenAI's type for a bad key
    response = httpx.request(method, f"{server.base_url}{path}", headers=bearer(KEY_FLAG),
                             json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
                             if "chat" in path else completion(), timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.server
def test_liveness_and_readiness_need_no_key(server):
    for path in ("/livez", "/readyz"):
        assert httpx.get(f"{server.base_url}{path}", timeout=30).status_code == 200


@pytest.mark.server
def test_keys_come_from_the_flag_the_file_and_the_environment(server):
    for key in (KEY_FLAG, KEY_FLAG_2, KEY_FILE, KEY_ENV, KEY_ENV_2):  # /health: not counted against the limits
        assert httpx.get(f"{server.base_url}/health", headers=bearer(key), timeout=30).status_code == 200


@pytest.mark.server
def test_the_openai_client_authenticates_with_its_api_key(server):
    good = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_FILE, max_retries=0)
    assert good.completions.create(model=MODEL, prompt="Hi", max_tokens=1).usage.completion_tokens == 1
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="Hi", max_tokens=1)


@pytest.mark.server
def test_requests_per_minute_are_limited_per_key(server):
    def call(key):
        return httpx.post(f"{server.base_url}/v1/completions", json=completion(), headers=bearer(key), timeout=60)

    statuses = [call(KEY_ENV).status_code for _ in range(RPM)]
    assert statuses == [200] * RPM
    limited = call(KEY_ENV)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert call(KEY_ENV_2).status_code == 200  # a different key is not limited


@pytest.mark.server
def test_tokenizer_and_model_routes_count_against_the_limit_and_say_where_it_stands(server):
    """They were free before: eight 663,000-character /tokenize calls took another tenant's completion from
    30 ms to 9.1 s."""
    calls = [("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1, 2]}),
             ("GET", "/v1/models", None), ("GET", f"/v1/models/{MODEL}", None), ("GET", "/tokenizer_info", None),
             ("POST", "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})]
    assert len(calls) == RPM
    remaining = []
    for method, path, body in calls:
        response = httpx.request(method, f"{server.base_url}{path}", json=body, headers=bearer(KEY_FLAG_3), timeout=30)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["x-ratelimit-limit-requests"] == str(RPM)
        assert response.headers["x-ratelimit-limit-tokens"] == str(TPM)
        assert re.fullmatch(r"\d+ms|[\d.]+s|\d+m[\d.]+s", response.headers["x-ratelimit-reset-requests"])
        remaining.append(int(response.headers["x-ratelimit-remaining-requests"]))
    assert remaining == sorted(remaining, reverse=True) and remaining[-1] <= 1
    limited = httpx.post(f"{server.base_url}/tokenize", json=calls[0][2], headers=bearer(KEY_FLAG_3), timeout=30)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"


@pytest.mark.server
def test_tokens_per_minute_reserve_prompt_plus_max_tokens_and_refund_the_rest(server):
    def call(**fields):
        return httpx.post(f"{server.base_url}/v1/completions", json=completion(**fields),
                          headers=bearer(KEY_FLAG_2), timeout=60)

    # 5 prompt tokens + 60 reserved each: two in a row fit only because the first refunds what it did not use.
    first = call(max_tokens=60, stop=["."])
    assert first.status_code == 200 and first.json()["usage"]["completion_tokens"] < 10
    assert int(first.headers["x-ratelimit-remaining-tokens"]) <= TPM - first.json()["usage"]["total_tokens"]
    assert call(max_tokens=60, stop=["."]).status_code == 200
    over = call(max_tokens=90)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    too_big = call(max_tokens=200)
    assert too_big.status_code == 400 and "more than the limit" in too_big.json()["error"]["message"]
    assert "retry-after" not in too_big.headers


@pytest.mark.server
def test_the_body_limit_flag_gives_413(server):
    body = completion(prompt="x" * (MAX_REQUEST_BYTES + 1))
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=bearer(KEY_FILE), timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert response.headers["connection"] == "close"
