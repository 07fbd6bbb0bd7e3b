"""The FastAPI app factory: routers, error handlers, middleware, and the engine loop's lifespan."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from server.api import chat, completions, health, models
from server.api.auth import require_api_key
from server.api.errors import install_error_handlers
from server.api.lifecycle import Lifecycle
from server.api.middleware import (
    AdmissionMiddleware,
    ErrorBoundaryMiddleware,
    RequestIdMiddleware,
    RequestLimitsMiddleware,
)
from server.api.readiness import ReadinessProbe, keep_reporting
from server.api.security import APIKeys, RateLimiter
from server.api.state import ServerState
from server.config import ServerConfig
from server.engine.async_engine import AsyncEngine
from telemetry.http_metrics import HttpMetricsMiddleware
from telemetry.service import Telemetry

ENGINE_JOIN_TIMEOUT_S = 10.0

_openapi = APIRouter(include_in_schema=False, dependencies=[Depends(require_api_key)])


@_openapi.get("/openapi.json")
async def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def create_app(
    engine: AsyncEngine,
    config: ServerConfig,
    lifecycle: Lifecycle | None = None,
    telemetry: Telemetry | None = None,
) -> FastAPI:
    """The engine's loop thread starts with the app and stops with it."""
    lifecycle = lifecycle or Lifecycle()
    readiness = ReadinessProbe(engine, lifecycle, telemetry.report_status if telemetry is not None else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start(asyncio.get_running_loop())
        reporting = None
        if telemetry is not None:
            telemetry.start()
            reporting = asyncio.create_task(keep_reporting(readiness))
        try:
            yield
        finally:
            if reporting is not None:
                reporting.cancel()
            if telemetry is not None:
                telemetry.shutdown()
            engine.stop()
            await asyncio.to_thread(engine.join, ENGINE_JOIN_TIMEOUT_S)

    app = FastAPI(
        title="Vigil",
        summary="OpenAI-compatible LLM inference server",
        lifespan=lifespan,
        openapi_url=None,  # served by _openapi instead, behind the API key
        docs_url=None,
        redoc_url=None,
    )
    app.state.vigil = ServerState(
        engine=engine,
        config=config,
        lifecycle=lifecycle,
        api_keys=APIKeys(config.api_keys),
        limiter=RateLimiter(config.rate_limit_rpm, config.rate_limit_tpm),
        readiness=readiness,
        metrics_exposition=telemetry.exposition if telemetry is not None else health.default_metrics_exposition,
        telemetry=telemetry,
    )
    install_error_handlers(app)
    for router in (completions.router, chat.router, models.router, health.probes, health.guarded, _openapi):
        app.include_router(router)
    # add_middleware puts each new one outermost: this reads innermost first.
    app.add_middleware(AdmissionMiddleware, lifecycle=lifecycle, engine=engine, exempt_paths=health.PROBE_PATHS)
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=config.max_request_bytes,
                       max_header_bytes=config.max_header_bytes)
    app.add_middleware(ErrorBoundaryMiddleware)
    app.add_middleware(RequestIdMiddleware)
    if telemetry is not None:
        app.add_middleware(HttpMetricsMiddleware, metrics=telemetry.metrics)
    return app
