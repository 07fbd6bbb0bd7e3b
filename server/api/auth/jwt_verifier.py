"""JSON Web Tokens from an identity provider, verified with PyJWT against the provider's JWKS (a file or a URL).

Only asymmetric algorithms are accepted, from a fixed allow-list, and each only with a key of its own type: never
``none``, never an HMAC "signed" with a public key.
"""

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import jwt

from server.api.auth.caller import Caller
from server.config import JWTConfig

ALLOWED_ALGORITHMS = {"RS256": "RSA", "ES256": "EC", "EdDSA": "OKP"}  # algorithm -> the JWK key type it needs
JWKS_FETCH_TIMEOUT_S = 10.0
# An unknown key id may mean the provider rotated its keys: look again, but not more often than this, so that
# tokens with made-up key ids cannot make the server hammer the provider.
UNKNOWN_KID_REFRESH_S = 10.0


class InvalidToken(Exception):
    """The token is not acceptable; the message says why, in words a client can act on."""


class JWKSet:
    """The provider's keys by key id, read again every ``refresh_s`` seconds or when a token names a key id that
    is not there (at most every UNKNOWN_KID_REFRESH_S)."""

    def __init__(self, source: str, refresh_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.refresh_s = refresh_s
        self._clock = clock
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()

    def load(self) -> None:
        """Read the key set now (blocking); raises ValueError if it cannot be read or holds no usable key."""
        try:
            if self.source.startswith(("http://", "https://")):
                response = httpx.get(self.source, timeout=JWKS_FETCH_TIMEOUT_S)
                response.raise_for_status()
                document = response.json()
            else:
                document = json.loads(Path(self.source).read_text())
            keys = {key.key_id: key for key in jwt.PyJWKSet.from_dict(document).keys}
        except (OSError, ValueError, httpx.HTTPError, jwt.PyJWKSetError) as error:
            raise ValueError(f"cannot read the JWKS at {self.source}: {error}") from error
        self._keys = keys
        self._loaded_at = self._clock()

    async def key(self, kid: str | None) -> jwt.PyJWK | None:
        if self._stale(kid):
            async with self._lock:
                if self._stale(kid):  # not refreshed meanwhile by a request that waited on the lock first
                    await asyncio.to_thread(self._refresh_keeping_old_keys)
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    def _stale(self, kid: str | None) -> bool:
        age = self._clock() - self._loaded_at
        return age > self.refresh_s or (kid not in self._keys and age > UNKNOWN_KID_REFRESH_S)

    def _refresh_keeping_old_keys(self) -> None:
        try:
            self.load()
        except ValueError:
            self._loaded_at = self._clock()  # the provider is down: keep the keys we have, and try again later


class JWTVerifier:
    def __init__(self, config: JWTConfig, keys: JWKSet | None = None) -> None:
        self.config = config
        self.keys = keys or JWKSet(config.jwks, config.refresh_s)

    async def identify(self, token: str) -> Caller:
        """The token's tenant; raises InvalidToken."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError:
            raise InvalidToken("the bearer token is neither a valid API key nor a well-formed JWT") from None
        except jwt.PyJWTError as error:  # a header PyJWT refuses, such as one with a "crit" it cannot honour
            raise InvalidToken(f"the JWT's header is not accepted: {error}") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in ALLOWED_ALGORITHMS:
            raise InvalidToken(f"JWT algorithm {algorithm!r} is not accepted; use one of "
                               f"{', '.join(ALLOWED_ALGORITHMS)}")
        key = await self.keys.key(header.get("kid"))  # PyJWT has checked that a kid is a string
        if key is None:
            raise InvalidToken("the JWT's key id is not in the identity provider's key set")
        if key.key_type != ALLOWED_ALGORITHMS[algorithm]:
            raise InvalidToken(f"the JWT's key id names a {key.key_type} key, which cannot verify {algorithm}")
        required = ["exp", "iat"] + ["iss"] * bool(self.config.issuer) + ["aud"] * bool(self.config.audience)
        try:
            claims = jwt.decode(
                token, key=key.key, algorithms=[algorithm], audience=self.config.audience,
                issuer=self.config.issuer, leeway=self.config.leeway_s,
                options={"require": required, "verify_aud": self.config.audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("the JWT has expired") from None
        except jwt.ImmatureSignatureError:
            raise InvalidToken("the JWT is not valid yet (nbf or iat lies in the future)") from None
        except jwt.InvalidAudienceError:
            raise InvalidToken("the JWT is not meant for this server (aud)") from None
        except jwt.InvalidIssuerError:
            raise InvalidToken("the JWT comes from an issuer this server does not trust (iss)") from None
        except jwt.PyJWTError as error:
            raise InvalidToken(f"the JWT is not valid: {error}") from None
        tenant = claims.get(self.config.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise InvalidToken(f"the JWT has no {self.config.tenant_claim!r} claim naming its tenant")
        return Caller(f"jwt-{tenant}")
