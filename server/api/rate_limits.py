"""Per-tenant rate limits: requests per minute, and tokens per minute reserved at admission."""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from server.api.errors import APIError, invalid_request


@dataclass
class TokenBucket:
    capacity: float
    per_second: float
    level: float
    updated: float

    @classmethod
    def per_minute(cls, amount: int, now: float) -> "TokenBucket":
        return cls(float(amount), amount / 60.0, float(amount), now)

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.per_second)
        self.updated = now

    def seconds_until_full(self) -> float:
        return (self.capacity - self.level) / self.per_second

    def take(self, amount: float, now: float) -> float | None:
        """Take ``amount`` and return None, or take nothing and return the seconds until it would fit."""
        self.refill(now)
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
    """Token buckets per tenant: one per API key, one per JWT tenant, or one for every anonymous caller."""

    def __init__(self, rpm: int | None, tpm: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._clock = clock
        self._requests: dict[str, TokenBucket] = {}
        self._tokens: dict[str, TokenBucket] = {}

    def headers(self, tenant: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for ``tenant`` now: each limit, what is left of it, and how long
        until it is whole again (as "1s", "6m0s" or "20ms")."""
        now, headers = self._clock(), {}
        for kind, limit, buckets in (("requests", self.rpm, self._requests), ("tokens", self.tpm, self._tokens)):
            if limit is None:
                continue
            bucket = buckets.get(tenant) or TokenBucket.per_minute(limit, now)
            bucket.refill(now)
            headers |= {f"x-ratelimit-limit-{kind}": str(limit),
                        f"x-ratelimit-remaining-{kind}": str(math.floor(bucket.level)),
                        f"x-ratelimit-reset-{kind}": go_duration(bucket.seconds_until_full())}
        return headers

    def admit_request(self, tenant: str) -> None:
        if self.rpm is None:
            return
        now = self._clock()
        bucket = self._requests.setdefault(tenant, TokenBucket.per_minute(self.rpm, now))
        wait = bucket.take(1, now)
        if wait is not None:
            raise APIError(429, f"rate limit reached: {self.rpm} requests per minute",
                           code="rate_limit_exceeded", retry_after=wait)

    def reserve_tokens(self, tenant: str, amount: int) -> TokenReservation:
        """Hold prompt + max_tokens for a request until it ends; 429 when the tenant's minute is spent, 400 for a
        request that no minute could ever hold (waiting would not help)."""
        if self.tpm is None:
            return TokenReservation(None, amount)
        if amount > self.tpm:
            raise invalid_request(f"this request needs up to {amount} tokens, more than the limit of {self.tpm} "
                                  "tokens per minute: lower max_tokens or shorten the prompt",
                                  param="max_tokens", code="exceeds_token_rate_limit")
        now = self._clock()
        bucket = self._tokens.setdefault(tenant, TokenBucket.per_minute(self.tpm, now))
        wait = bucket.take(amount, now)
        if wait is not None:
            raise APIError(429, f"rate limit reached: {self.tpm} tokens per minute",
                           code="rate_limit_exceeded", retry_after=math.ceil(wait))
        return TokenReservation(bucket, amount)


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes it (Go's format): "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
