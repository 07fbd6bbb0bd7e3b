"""Probes for orchestrators: /livez (process and engine loop alive), /readyz (ready to serve), /health
(readiness, behind the API key when keys are set), and /metrics (Prometheus exposition)."""

import prometheus_client
from fastapi import APIRouter, Request
from starlette.responses import Response

from server.api.errors import LOADING, SHUTTING_DOWN, APIError, unavailable
from server.api.protocol import ErrorResponse, HealthStatus
from server.api.state import ServerState, State

PROBE_PATHS = frozenset({"/livez", "/readyz", "/health", "/metrics"})
# Orchestrators probe these without credentials; /metrics joins them unless --metrics-require-api-key.
UNAUTHENTICATED_PATHS = frozenset({"/livez", "/readyz"})
_PROBE_RESPONSES = {503: {"model": ErrorResponse, "description": "not alive or not ready"}}
_MESSAGES = {
    "engine_dead": "the engine loop has failed",
    "engine_stalled": "the engine loop is stuck in a step",
    "canary_timeout": "the engine did not answer a one-token canary in time",
    "canary_failed": "the engine answered a canary with no token",
    "draining": SHUTTING_DOWN,
    "loading": LOADING,
    "warming_up": "the model has loaded and is warming up (its first request)",
}

probes = APIRouter(tags=["health"], responses=_PROBE_RESPONSES)
guarded = APIRouter(tags=["health"])


def _problem(code: str) -> APIError:
    return unavailable(_MESSAGES.get(code, code), code)


async def _readiness(state: ServerState) -> HealthStatus:
    problem = await state.readiness.readiness_problem()
    if problem is not None:
        raise _problem(problem)
    return HealthStatus()


@probes.get("/livez", response_model=HealthStatus)
async def livez(state: State) -> HealthStatus:
    problem = state.readiness.liveness_problem()
    if problem is not None:
        raise _problem(problem)
    return HealthStatus()


@probes.get("/readyz", response_model=HealthStatus)
async def readyz(state: State) -> HealthStatus:
    return await _readiness(state)


@guarded.get("/health", response_model=HealthStatus, responses=_PROBE_RESPONSES)
async def health(state: State) -> HealthStatus:
    return await _readiness(state)


@guarded.get("/metrics", responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
async def metrics(request: Request, state: State) -> Response:
    body, content_type = state.metrics_exposition(request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type})


def default_metrics_exposition(accept: str | None) -> tuple[bytes, str]:
    """The process-wide default registry, until telemetry hands the app its own."""
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
