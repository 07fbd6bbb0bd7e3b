"""Who may call: authentication from the request's head (see middleware.py), and the dependencies that hand the
caller to the routes and count it against its rate limits."""

from typing import Annotated

from fastapi import Depends, Request

from server.api.auth.caller import ANONYMOUS, Caller
from server.api.state import State

CALLER_SCOPE_KEY = "vigil.caller"
RATE_LIMITED_TENANT_SCOPE_KEY = "vigil.rate_limited_tenant"


def caller_of(request: Request) -> Caller:
    """Set by AuthMiddleware; anonymous where authentication is off."""
    return request.scope.get(CALLER_SCOPE_KEY, ANONYMOUS)


async def admit_caller(request: Request, state: State) -> Caller:
    """Count the request against its tenant's requests-per-minute limit; its response (a 429 too) then carries
    the tenant's ``x-ratelimit-*`` headers."""
    caller = caller_of(request)
    request.scope[RATE_LIMITED_TENANT_SCOPE_KEY] = caller.tenant
    state.limiter.admit_request(caller.tenant)
    return caller


RateLimitedCaller = Annotated[Caller, Depends(admit_caller)]
