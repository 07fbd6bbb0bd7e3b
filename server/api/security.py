"""API keys and per-key rate limits (requests per minute, and tokens per minute reserved at admission)."""

import hashlib
import math
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from server.api.errors import APIError

ANONYMOUS = "anonymous"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


class APIKeys:
    """Keys are kept only as SHA-256 digests; a presented key is compared against every one of them."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(key) for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def identify(self, authorization: str | None) -> str:
        """The caller's identity (its key's digest, hex), or raise 401. Without keys everyone is anonymous."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or not token.isascii():
            raise APIError(401, "missing or malformed API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
        candidate = _digest(token)
        # No early exit: every digest is compared, so the time taken says nothing about which one matched.
        matches = [secrets.compare_digest(candidate, digest) for digest in self._digests]
        if not any(matches):
            raise APIError(401, "invalid API key", code="invalid_api_key")
        return candidate.hex()


@dataclass
class TokenBucket:
    capacity: float
    per_second: float
    level: float
    updated: float

    @classmethod
    def per_minute(cls, amount: int, now: float) -> "TokenBucket":
        return cls(float(amount), amount / 60.0, float(amount), now)

    def take(self, amount: float, now: float) -> float | None:
        """Take ``amount`` and return None, or take nothing and return the seconds until it would fit."""
        self.level = min(self.capacity, self.level + (now - self.updated) * self.per_second)
        self.updated = now
        if amount <= self.level:
            self.level -= amount
            return None
        return (amount - self.level) / self.per_second

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)


class TokenReservation:
    """Tokens held for one request; ``settle`` returns what it did not use. Settling twice does nothing."""

    def __init__(self, bucket: TokenBucket | None, amount: int) -> None:
        self._bucket = bucket
        self.amount = amount

    def settle(self, used: int) -> None:
        if self._bucket is not None:
            self._bucket.give_back(max(0, self.amount - used))
            self._bucket = None


class RateLimiter:
    """Token buckets per caller. Buckets are created per API key (or one for anonymous callers), so they are
    bounded by the number of configured keys."""

    def __init__(self, rpm: int | None, tpm: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def admit_request(self, caller: str) -> None:
        if self.rpm is None:
            return
        now = self._clock()
        bucket = self._requests.setdefault(caller, TokenBucket.per_minute(self.rpm, now))
        wait = bucket.take(1, now)
        if wait is not None:
            raise APIError(429, f"rate limit reached: {self.rpm} requests per minute",
                           code="rate_limit_exceeded", retry_after=wait)

    def reserve_tokens(self, caller: str, amount: int) -> TokenReservation:
        """Hold prompt + max_tokens for a request until it ends; raise 429 when the key's minute is spent."""
        if self.tpm is None:
            return TokenReservation(None, amount)
        if amount > self.tpm:
            raise APIError(429, f"this request needs up to {amount} tokens, more than the limit of {self.tpm} "
                           "tokens per minute: lower max_tokens or shorten the prompt",
                           code="rate_limit_exceeded", retry_after=60)
        now = self._clock()
        bucket = self._tokens.setdefault(caller, TokenBucket.per_minute(self.tpm, now))
        wait = bucket.take(amount, now)
        if wait is not None:
            raise APIError(429, f"rate limit reached: {self.tpm} tokens per minute",
                           code="rate_limit_exceeded", retry_after=math.ceil(wait))
        return TokenReservation(bucket, amount)
