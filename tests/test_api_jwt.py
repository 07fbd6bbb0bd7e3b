"""JWTs against keys made here (no identity provider is reachable): what is accepted, every way a token is
refused, a JWKS refresh, and a real server that takes JWTs beside API keys."""

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from server.api.auth.jwt_verifier import UNKNOWN_KID_REFRESH_S, InvalidToken, JWKSet, JWTVerifier
from server.config import JWTConfig
from tests.api_server import APIServer

ISSUER, AUDIENCE = "https://idp.test", "vigil"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_keys() -> dict[str, object]:
    return {"rsa-1": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ec-1": ec.generate_private_key(ec.SECP256R1()),
            "ed-1": ed25519.Ed25519PrivateKey.generate()}


ALGORITHMS = {"rsa-1": "RS256", "ec-1": "ES256", "ed-1": "EdDSA"}


def write_jwks(path: Path, keys: dict[str, object]) -> Path:
    entries = []
    for kid, key in keys.items():
        algorithm = jwt.get_algorithm_by_name(ALGORITHMS.get(kid, "RS256"))
        entry = json.loads(algorithm.to_jwk(key.public_key()))
        entries.append({**entry, "kid": kid})
    path.write_text(json.dumps({"keys": entries}))
    return path


def token(key: object, kid: str, algorithm: str | None = None, **overrides: object) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "acme", "iat": now, "nbf": now, "exp": now + 300, **overrides}
    claims = {name: value for name, value in claims.items() if value is not None}
    return jwt.encode(claims, key, algorithm=algorithm or ALGORITHMS[kid], headers={"kid": kid})


@pytest.fixture(scope="module")
def keys() -> dict[str, object]:
    return new_keys()


@pytest.fixture
def verifier(keys, tmp_path) -> JWTVerifier:
    config = JWTConfig(str(write_jwks(tmp_path / "jwks.json", keys)), ISSUER, AUDIENCE, leeway_s=5)
    verifier = JWTVerifier(config)
    verifier.keys.load()
    return verifier


def identify(verifier: JWTVerifier, text: str):
    return asyncio.run(verifier.identify(text))


@pytest.mark.parametrize("kid", ["rsa-1", "ec-1", "ed-1"])
def test_each_allowed_algorithm_names_its_tenant(verifier, keys, kid):
    assert identify(verifier, token(keys[kid], kid)).tenant == "jwt-acme"


def unsigned(**claims: object) -> str:
    return jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "acme", "iat": 0, "exp": 2**40, **claims}, None,
                      algorithm="none")


def hmac_signed_with(secret: bytes) -> str:
    """A token PyJWT itself refuses to make: HS256 keyed with a public key's PEM, written out by hand."""

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "acme", "iat": now, "exp": now + 300}
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode()) + b"." + b64(
        json.dumps(claims).encode())
    return (signing_input + b"." + b64(hmac.new(secret, signing_input, hashlib.sha256).digest())).decode()


def with_header(header: dict, keys) -> str:
    """A token whose header is written by hand (PyJWT will not write these), signed as rsa-1 signs."""

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "acme", "iat": now, "exp": now + 300}
    signing_input = b64(json.dumps(header).encode()) + b"." + b64(json.dumps(claims).encode())
    signature = jwt.get_algorithm_by_name("RS256").sign(signing_input, keys["rsa-1"])
    return (signing_input + b"." + b64(signature)).decode()


def rsa_public_pem(keys) -> bytes:
    return keys["rsa-1"].public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)


REFUSALS = {
    "expired": (lambda keys: token(keys["rsa-1"], "rsa-1", exp=int(time.time()) - 60), "expired"),
    "not yet valid": (lambda keys: token(keys["rsa-1"], "rsa-1", nbf=int(time.time()) + 600), "not valid yet"),
    "issued in the future": (lambda keys: token(keys["rsa-1"], "rsa-1", iat=int(time.time()) + 600), "not valid yet"),
    "wrong audience": (lambda keys: token(keys["rsa-1"], "rsa-1", aud="someone-else"), "aud"),
    "wrong issuer": (lambda keys: token(keys["rsa-1"], "rsa-1", iss="https://evil.test"), "iss"),
    "no expiry": (lambda keys: token(keys["rsa-1"], "rsa-1", exp=None), "exp"),
    "alg none": (lambda keys: unsigned(), "not accepted"),
    # The classic confusion: HS256 "signed" with the RSA public key as the HMAC secret.
    "HS256 with the public key": (lambda keys: hmac_signed_with(rsa_public_pem(keys)), "not accepted"),
    "unknown kid": (lambda keys: token(keys["rsa-1"], "nobody-knows", algorithm="RS256"), "key id"),
    "a key of another type": (lambda keys: token(keys["rsa-1"], "ec-1", algorithm="RS256"), "cannot verify"),
    "no tenant": (lambda keys: token(keys["rsa-1"], "rsa-1", sub=None), "tenant"),
    # PyJWT raises InvalidTokenError (not DecodeError) for these: each was a 500 before.
    "a crit header": (lambda keys: with_header({"alg": "RS256", "kid": "rsa-1", "crit": ["exp"]}, keys), "header"),
    "crit not a list": (lambda keys: with_header({"alg": "RS256", "kid": "rsa-1", "crit": 1}, keys), "header"),
    "alg a list": (lambda keys: with_header({"alg": ["RS256"], "kid": "rsa-1"}, keys), "not accepted"),
    "kid an object": (lambda keys: with_header({"alg": "RS256", "kid": {"a": 1}}, keys), "must be a string"),
    "forged signature": (lambda keys: token(rsa.generate_private_key(public_exponent=65537, key_size=2048),
                                            "rsa-1"), "not valid"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_bad_token_is_refused_with_a_reason(verifier, keys, case):
    make, reason = REFUSALS[case]
    with pytest.raises(InvalidToken, match=reason):
        identify(verifier, make(keys))


@contextlib.contextmanager
def served_from(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1, as an identity provider publishes its JWKS."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("published", ["as a file", "at a URL"])
def test_a_rotated_key_is_picked_up_by_a_refresh_on_its_unknown_kid(tmp_path, keys, published):
    path = write_jwks(tmp_path / "jwks.json", {"rsa-1": keys["rsa-1"]})
    with contextlib.ExitStack() as stack:
        source = str(path) if published == "as a file" else stack.enter_context(served_from(tmp_path)) + "/jwks.json"
        clock = Clock()
        key_set = JWKSet(source, refresh_s=3600, clock=clock)
        key_set.load()
        verifier = JWTVerifier(JWTConfig(source, ISSUER, AUDIENCE), key_set)
        rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        write_jwks(path, {"rsa-1": keys["rsa-1"], "rsa-2": rotated})
        with pytest.raises(InvalidToken, match="key id"):  # too soon after the last read: made-up kids cost nothing
            identify(verifier, token(rotated, "rsa-2", algorithm="RS256"))
        clock.now += UNKNOWN_KID_REFRESH_S + 1
        assert identify(verifier, token(rotated, "rsa-2", algorithm="RS256")).tenant == "jwt-acme"


@pytest.mark.server
def test_a_server_takes_jwts_beside_api_keys(smollm_folder, keys, tmp_path):
    jwks = write_jwks(tmp_path / "jwks.json", keys)
    server = APIServer(smollm_folder, "--api-key", "plain-key", "--jwt-jwks", str(jwks), "--jwt-issuer", ISSUER,
                       "--jwt-audience", AUDIENCE).wait_ready()
    try:
        def models(bearer: str) -> httpx.Response:
            return httpx.get(f"{server.base_url}/v1/models", headers={"authorization": f"Bearer {bearer}"}, timeout=10)

        assert models(token(keys["ed-1"], "ed-1")).status_code == 200
        assert models("plain-key").status_code == 200
        expired = models(token(keys["ec-1"], "ec-1", exp=int(time.time()) - 60))
        assert expired.status_code == 401 and expired.json()["error"]["code"] == "invalid_api_key"
        assert "expired" in expired.json()["error"]["message"]
    finally:
        server.stop()
