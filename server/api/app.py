"""The FastAPI app factory: routers, error handlers, middleware, and the engine loop's lifespan."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from server.api import chat, completions, console, health, models, tokenize
from server.api.agent_check import serve_agent_check
from server.api.auth.api_keys import APIKeys
from server.api.auth.authenticator import Authenticator
from server.api.auth.jwt_verifier import JWTVerifier
from server.api.auth.middleware import AuthMiddleware
from server.api.errors import install_error_handlers
from server.api.lifecycle import Lifecycle
from server.api.middleware import (
    AdmissionMiddleware,
    ErrorBoundaryMiddleware,
    RateLimitHeadersMiddleware,
    RequestIdMiddleware,
    RequestLimitsMiddleware,
)
from server.api.rate_limits import RateLimiter
from server.api.readiness import AllModelsReady, ReadinessProbe, StatusReport, keep_reporting
from server.api.ready_line import announce_when_ready
from server.api.router import ModelRouter, ServedModel
from server.api.state import ServerState
from server.api.structured_output import GrammarCompiler
from server.api.tool_parsers import TOOL_PARSERS
from server.config import ServerConfig
from server.engine.async_engine import AsyncEngine
from telemetry.http_metrics import HttpMetricsMiddleware
from telemetry.service import Telemetry

ENGINE_JOIN_TIMEOUT_S = 10.0
# Templates and tokenizing run here, off the event loop; a few threads, so that one long prompt holds one.
TOKENIZER_THREADS = 4

_openapi = APIRouter(include_in_schema=False)


@_openapi.get("/openapi.json")
async def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def authenticator_for(config: ServerConfig) -> Authenticator:
    """API keys, and JWTs where a JWKS is configured (read now: a JWKS that cannot be read stops start-up)."""
    verifier = None
    if config.jwt is not None:
        verifier = JWTVerifier(config.jwt)
        verifier.keys.load()
    return Authenticator(APIKeys(config.api_keys), verifier)


def create_app(
    engine: AsyncEngine,
    config: ServerConfig,
    lifecycle: Lifecycle | None = None,
    telemetry: Telemetry | None = None,
    router: ModelRouter | None = None,
) -> FastAPI:
    """The engines' loop threads start with the app and stop with it. ``router`` holds the served models when there
    are several (``engine`` is then the default one's); without it, ``engine`` serves as
    ``config.served_model_name``."""
    lifecycle = lifecycle or Lifecycle()
    router = router or ModelRouter([ServedModel(config.served_model_name, engine)])
    readiness = AllModelsReady([
        ReadinessProbe(model.engine, lifecycle, _status_report(telemetry, model.name))
        for model in router.models.values()
    ])
    authenticator = authenticator_for(config)
    tokenizer_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="vigil-tokenizer")
    grammars = {model.name: GrammarCompiler(model.engine, config.share_prefix_cache_across_tenants)
                for model in router.models.values()}
    engines = router.engines
    console_on = telemetry is not None and telemetry.console is not None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for each in engines:
            each.start(asyncio.get_running_loop())
        reporting = None
        if telemetry is not None:
            telemetry.start()
            reporting = asyncio.create_task(keep_reporting(readiness))
        announcing = asyncio.create_task(announce_when_ready(readiness, config, router, console_on))
        agent = None
        if config.agent_port is not None:
            agent = await serve_agent_check(readiness, engine, config.host, config.agent_port)
        try:
            yield
        finally:
            announcing.cancel()
            if agent is not None:
                agent.close()
            if reporting is not None:
                reporting.cancel()
            if telemetry is not None:
                telemetry.shutdown()
            for each in engines:
                each.stop()
            for each in engines:
                await asyncio.to_thread(each.join, ENGINE_JOIN_TIMEOUT_S)
            tokenizer_pool.shutdown(wait=False, cancel_futures=True)
            for compiler in grammars.values():
                compiler.shutdown()

    limiter = RateLimiter(config.rate_limit_rpm, config.rate_limit_tpm)
    app = FastAPI(
        title="Vigil",
        summary="OpenAI-compatible LLM inference server",
        lifespan=lifespan,
        openapi_url=None,  # served by _openapi instead, behind authentication
        docs_url=None,
        redoc_url=None,
    )
    app.state.vigil = ServerState(
        engine=router.default.engine,
        router=router,
        config=config,
        lifecycle=lifecycle,
        limiter=limiter,
        readiness=readiness,
        metrics_exposition=telemetry.exposition if telemetry is not None else health.default_metrics_exposition,
        tokenizer_pool=tokenizer_pool,
        grammars=grammars,
        tool_parser=TOOL_PARSERS[config.tool_call_parser](),
        authenticated=authenticator.enabled,
        telemetry=telemetry,
    )
    install_error_handlers(app)
    routes = (completions.router, chat.router, tokenize.router, models.router, health.probes, health.guarded,
              _openapi, *((console.router,) if console_on else ()))
    for api_router in routes:
        app.include_router(api_router)
    # add_middleware puts each new one outermost: this reads innermost first.
    app.add_middleware(AdmissionMiddleware, lifecycle=lifecycle, models_loading=lambda: router.loading,
                       exempt_paths=health.PROBE_PATHS)
    # The console's data is guarded as /metrics is; its page and assets carry no data.
    metrics_paths = {"/metrics", *((console.DATA_PATH,) if console_on else ())}
    open_paths = health.UNAUTHENTICATED_PATHS | (console.OPEN_PATHS if console_on else set()) | (
        metrics_paths if not config.metrics_require_api_key else set())
    app.add_middleware(AuthMiddleware, authenticator=authenticator, open_paths=open_paths)
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=config.max_request_bytes,
                       max_header_bytes=config.max_header_bytes)
    app.add_middleware(ErrorBoundaryMiddleware)
    app.add_middleware(RateLimitHeadersMiddleware, limiter=limiter)
    app.add_middleware(RequestIdMiddleware)
    if telemetry is not None:
        templates = [(route.path, route.path_regex) for api_router in routes for route in api_router.routes]
        app.add_middleware(HttpMetricsMiddleware, metrics=telemetry.metrics, routes=templates)
    return app


def _status_report(telemetry: Telemetry | None, model: str) -> StatusReport | None:
    if telemetry is None:
        return None
    return lambda phase, ready: telemetry.report_status(phase, ready, model)
