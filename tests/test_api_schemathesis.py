"""Schemathesis against the server's own /openapi.json, in positive and negative modes: never a 5xx."""

import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection, not_a_server_error

from tests.api_server import shared_server

pytestmark = pytest.mark.server

WITH_BODIES = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/tokenize"),
               ("POST", "/detokenize")]
# Nothing here takes a body or a typed parameter, so negative mode has nothing to break: positive only.
READS = [("GET", "/v1/models"), ("GET", "/v1/models/{model}"), ("GET", "/livez"), ("GET", "/readyz"),
         ("GET", "/health"), ("GET", "/metrics"), ("GET", "/version"), ("GET", "/tokenizer_info")]
CASES = [(*op, GenerationMode.POSITIVE) for op in WITH_BODIES + READS] + [
    (*op, GenerationMode.NEGATIVE) for op in WITH_BODIES
]
MAX_EXAMPLES = 30
# Keeps a generated valid request cheap on the CPU: the checks are about the HTTP layer, not long generations.
MAX_GENERATED_TOKENS = 3
MAX_GENERATED_N = 2
REQUEST_TIMEOUT_S = 60
OPERATION_BUDGET_S = 40  # past it, an operation's remaining examples pass without a request


@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


@pytest.fixture(scope="module")
def schema(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json", timeout=REQUEST_TIMEOUT_S)


def test_every_operation_in_the_schema_is_fuzzed(schema):
    found = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert found == set(WITH_BODIES + READS)


def _cheapen(case) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(field), int) and not isinstance(body[field], bool):
            body[field] = min(body[field], MAX_GENERATED_TOKENS)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_GENERATED_TOKENS  # absent, chat would run to the end of the context
    if isinstance(body.get("n"), int) and not isinstance(body["n"], bool):
        body["n"] = min(body["n"], MAX_GENERATED_N)


@pytest.mark.parametrize("method, path, mode", CASES, ids=[f"{m} {p} {mode.value}" for m, p, mode in CASES])
def test_no_generated_request_gets_a_5xx(schema, method, path, mode):
    strategy = schema[path][method].as_strategy(generation_mode=mode)
    # Negative cases break the schema: each must also be refused with a 4xx.
    checks = [not_a_server_error] + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])
    deadline = time.monotonic() + OPERATION_BUDGET_S
    calls = []

    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)
    def run(case):
        if time.monotonic() > deadline:
            return
        _cheapen(case)
        case.call_and_validate(checks=checks, timeout=REQUEST_TIMEOUT_S)
        calls.append(case)

    run()
    assert calls, "no example was sent"


def test_the_server_survives_the_fuzzing_healthy_with_every_block_free(server):
    assert httpx.get(f"{server.base_url}/livez", timeout=10).status_code == 200
    assert httpx.get(f"{server.base_url}/readyz", timeout=60).status_code == 200
    server.wait_all_blocks_free(timeout=10)
