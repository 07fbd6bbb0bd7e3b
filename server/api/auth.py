"""Dependencies that guard routes: API keys, the metrics flag, and the per-key request rate."""

from typing import Annotated

from fastapi import Depends, Request

from server.api.state import State


def _authorization(request: Request) -> str | None:
    return request.headers.get("authorization")


async def require_api_key(request: Request, state: State) -> str:
    """The caller's identity; 401 when keys are configured and the request lacks a valid one."""
    return state.api_keys.identify(_authorization(request))


async def require_metrics_key(request: Request, state: State) -> None:
    if state.config.metrics_require_api_key:
        state.api_keys.identify(_authorization(request))


Caller = Annotated[str, Depends(require_api_key)]


async def admit_caller(caller: Caller, state: State) -> str:
    """Authenticate, then count the request against the caller's requests-per-minute limit."""
    state.limiter.admit_request(caller)
    return caller


RateLimitedCaller = Annotated[str, Depends(admit_caller)]
