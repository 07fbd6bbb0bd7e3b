"""Who is calling: the tenant that rate limits, traces and the prefix cache's isolation go by."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    tenant: str


ANONYMOUS = Caller("anonymous")
