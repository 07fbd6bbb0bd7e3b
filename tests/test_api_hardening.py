"""The HTTP edge under hostile clients, on a real socket: slow heads, too many connections, bodies framed two ways
or too large, credentials sent twice, huge prompts, and one tenant probing another's prefix cache."""

import concurrent.futures
import hashlib
import json
import socket

import httpx
import pytest

from tests.api_server import APIServer, metric_samples

pytestmark = pytest.mark.server

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 24
MAX_REQUEST_BYTES = 5 * 2**20
SOCKET_TIMEOUT_S = HEADER_TIMEOUT_S + 20  # a bound on each wait, not a speed claim
SHARED_PROMPT = "You are the assistant of a careful team. " * 40


@pytest.fixture(scope="module")
def server(smollm_folder):
    server = APIServer(
        smollm_folder, "--api-key", KEY_A, "--api-key", KEY_B, "--header-timeout", str(HEADER_TIMEOUT_S),
        "--max-connections", str(MAX_CONNECTIONS), "--max-request-bytes", str(MAX_REQUEST_BYTES),
    ).wait_ready()
    yield server
    server.stop()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def connect(server: APIServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=SOCKET_TIMEOUT_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a bounded wait: the socket's timeout)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    return received


def head(method: str, path: str, *headers: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode()


def prefix_cache_hits(server: APIServer) -> float:
    samples = metric_samples(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
    return samples[("vigil_prefix_cache_hits_total", frozenset({"model": "smollm"}.items()))]


def complete(server: APIServer, key: str, prompt: str, **fields) -> httpx.Response:
    body = {"model": "smollm", "prompt": prompt, "max_tokens": 1, "temperature": 0.0, **fields}
    return httpx.post(f"{server.base_url}/v1/completions", json=body, headers=auth(key), timeout=60)


def test_connections_past_the_cap_get_503_and_are_closed(server):
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        extra = connect(server)
        answer = read_until_closed(extra)
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
    finally:
        for sock in held:
            sock.close()
    assert complete(server, KEY_A, "Hello").status_code == 200


def test_a_client_that_never_finishes_its_head_gets_408_and_is_closed(server):
    slow = [connect(server) for _ in range(10)]
    for sock in slow:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    silent = connect(server)
    answers = [read_until_closed(sock) for sock in [*slow, silent]]
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), answers[:2]
    assert complete(server, KEY_A, "Hello").status_code == 200


def test_authentication_is_checked_before_any_body_is_read(server):
    sock = connect(server)
    # A body is announced and never sent: the 401 comes from the head alone.
    sock.sendall(head("POST", "/v1/completions", "Content-Type: application/json", "Content-Length: 100000"))
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 401")
    assert b"connection: close" in answer.lower()  # and closed at once, never waiting for the body


def test_two_authorization_headers_are_a_400(server):
    response = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"},
                          headers=[("authorization", f"Bearer {KEY_A}"), ("authorization", f"Bearer {KEY_B}")])
    assert response.status_code == 400 and response.json()["error"]["code"] == "duplicate_authorization"


def test_a_body_framed_two_ways_is_refused_and_the_connection_closed(server):
    sock = connect(server)
    sock.sendall(head("POST", "/v1/completions", f"Authorization: Bearer {KEY_A}", "Content-Length: 4",
                      "Transfer-Encoding: chunked") + b"0\r\n\r\n")
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400") and b"ambiguous_body_length" in answer


def test_an_oversized_body_gets_413_and_the_connection_closes(server):
    declared = connect(server)
    declared.sendall(head("POST", "/v1/completions", f"Authorization: Bearer {KEY_A}",
                          "Content-Type: application/json", f"Content-Length: {MAX_REQUEST_BYTES + 1}"))
    answer = read_until_closed(declared)
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
    # A chunked body that grows past the limit: the server stops reading it and closes the connection (the
    # client may see its 413 or, with its own bytes still unread there, a reset).
    streamed = connect(server)
    streamed.sendall(head("POST", "/v1/completions", f"Authorization: Bearer {KEY_A}",
                          "Content-Type: application/json", "Transfer-Encoding: chunked"))
    chunk = b"x" * 2**20
    try:
        for _ in range(8):
            streamed.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        answer = read_until_closed(streamed)
        assert answer.startswith(b"HTTP/1.1 413")
    except (ConnectionResetError, BrokenPipeError):
        streamed.close()


def test_responses_carry_no_server_header(server):
    assert "server" not in httpx.get(f"{server.base_url}/livez", timeout=10).headers


def test_a_prompt_too_long_for_any_context_is_refused_by_its_length_while_others_are_served(server):
    huge = "word " * 800_000  # 4 MB
    with concurrent.futures.ThreadPoolExecutor(7) as pool:
        refusals = [pool.submit(complete, server, KEY_A, huge) for _ in range(6)]
        served = pool.submit(complete, server, KEY_B, "The capital of France is", max_tokens=4)
        assert served.result().status_code == 200
        for refusal in refusals:
            error = refusal.result().json()["error"]
            # Only the length check, before any tokenizing, speaks of characters.
            assert refusal.result().status_code == 400 and error["param"] == "prompt"
            assert error["code"] == "context_length_exceeded" and "maximum context length" in error["message"]
            assert "characters" in error["message"]


def test_one_tenant_cannot_hit_or_time_another_tenants_cached_prefix(server):
    assert complete(server, KEY_A, SHARED_PROMPT).status_code == 200
    before = prefix_cache_hits(server)
    assert complete(server, KEY_B, SHARED_PROMPT).status_code == 200
    assert prefix_cache_hits(server) == before  # tenant B computed it cold
    assert complete(server, KEY_A, SHARED_PROMPT).status_code == 200
    own = prefix_cache_hits(server) - before
    assert own >= 16 * 20  # tenant A's own blocks are found again
    # Within a tenant, a request's cache_salt keeps it apart too.
    salted = prefix_cache_hits(server)
    assert complete(server, KEY_A, SHARED_PROMPT, cache_salt="private").status_code == 200
    assert prefix_cache_hits(server) == salted


def test_logs_name_the_tenant_of_each_generation_never_its_key(server):
    assert complete(server, KEY_B, "Hello").status_code == 200
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
    served = [line for line in lines if line["event"] == "generation_finished"]
    tenant_b = f"key-{hashlib.sha256(KEY_B.encode()).hexdigest()[:16]}"
    assert any(line["tenant"] == tenant_b and line["outcome"] == "finished" for line in served)
    assert not any(KEY_A in json.dumps(line) or KEY_B in json.dumps(line) for line in lines)


def test_the_server_is_healthy_with_every_block_free_after_all_that(server):
    # Runs last in this module (pytest keeps file order).
    server.wait_all_blocks_free(timeout=10)
    assert complete(server, KEY_B, "Hello").status_code == 200
