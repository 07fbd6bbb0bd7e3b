"""What every route needs, built once by the app factory and kept on ``app.state``."""

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from server.api.lifecycle import Lifecycle
from server.api.rate_limits import RateLimiter
from server.api.readiness import AllModelsReady
from server.api.router import ModelRouter
from server.api.structured_output import GrammarCompiler
from server.api.tool_parsers import ToolParser
from server.config import ServerConfig
from server.engine.async_engine import AsyncEngine
from telemetry.service import Telemetry

# The Accept header in; the body and its content type out (telemetry supplies one over its own registry).
MetricsExposition = Callable[[str | None], tuple[bytes, str]]


@dataclass
class ServerState:
    """``engine`` is the default model's (``router.default``); ``grammars`` are compiled per model, over each
    model's own tokenizer."""

    engine: AsyncEngine
    router: ModelRouter
    config: ServerConfig
    lifecycle: Lifecycle
    limiter: RateLimiter
    readiness: AllModelsReady
    metrics_exposition: MetricsExposition
    tokenizer_pool: ThreadPoolExecutor
    grammars: dict[str, GrammarCompiler]
    tool_parser: ToolParser
    authenticated: bool = False
    telemetry: "Telemetry | None" = None
    started_at: int = field(default_factory=lambda: int(time.time()))


def get_state(request: Request) -> ServerState:
    return request.app.state.vigil


State = Annotated[ServerState, Depends(get_state)]
