"""API keys, kept only as SHA-256 digests."""

import hashlib
import secrets
from collections.abc import Iterable

from server.api.auth.caller import Caller


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("ascii")).digest()


class APIKeys:
    """A presented key is compared against every digest, with no early exit, so that the time taken says nothing
    about which one matched. A key's tenant is named after its digest, never after the key."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(key) for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def identify(self, token: str) -> Caller | None:
        """The caller whose key ``token`` is, or None."""
        if not token.isascii():
            return None
        candidate = _digest(token)
        matches = [secrets.compare_digest(candidate, digest) for digest in self._digests]
        return Caller(f"key-{candidate.hex()[:16]}") if any(matches) else None
