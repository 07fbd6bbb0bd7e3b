"""The live console: its page and vendored assets (no CDN), and its data as JSON from one endpoint.

The page and its assets hold no data and are open; ``/console/data.json`` is guarded as /metrics is
(``--metrics-require-api-key``). Prompts are never in it; outputs only under ``--log-requests`` and only while no
authentication is configured, since any key that reads the console would otherwise read every tenant's text."""

import importlib.metadata
import time
from pathlib import Path

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse, JSONResponse

from server.api.errors import APIError
from server.api.state import ServerState, State

ASSETS = Path(__file__).resolve().with_name("console_assets")
PAGE_PATH = "/console"
DATA_PATH = "/console/data.json"
ASSET_TYPES = {
    "console.js": "text/javascript", "console.css": "text/css", "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css", "uPlot.LICENSE": "text/plain",
}
ASSET_PATHS = frozenset(f"/console/assets/{name}" for name in ASSET_TYPES)
# The page's own files: a browser cannot send an API key for them, and they carry no data.
OPEN_PATHS = frozenset({PAGE_PATH, *ASSET_PATHS})

router = APIRouter(include_in_schema=False)


def _version() -> str:
    try:
        return importlib.metadata.version("vigil-serve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()


@router.get(PAGE_PATH)
async def page() -> FileResponse:
    return FileResponse(ASSETS / "console.html", media_type="text/html")


@router.get("/console/assets/{name}")
async def asset(name: str) -> FileResponse:
    if name not in ASSET_TYPES:
        raise APIError(404, f"no console asset {name!r}", code="not_found")
    return FileResponse(ASSETS / name, media_type=ASSET_TYPES[name])


def server_description(state: ServerState) -> dict:
    """What is running beyond the models: version, uptime and the flags that change what the server does."""
    config = state.config
    return {
        "version": VERSION,
        "uptime_s": int(time.time()) - state.started_at,
        "flags": {
            "authentication": state.authenticated,
            "metrics_require_api_key": config.metrics_require_api_key,
            "tls": config.tls is not None,
            "rate_limit_rpm": config.rate_limit_rpm,
            "rate_limit_tpm": config.rate_limit_tpm,
            "max_connections": config.max_connections,
            "share_prefix_cache_across_tenants": config.share_prefix_cache_across_tenants,
            "tracing": state.telemetry.tracer is not None,
        },
    }


@router.get(DATA_PATH)
async def data(state: State, since: int | None = Query(default=None)) -> JSONResponse:
    """The series rows stamped after ``since`` (a Unix second; without it, the last quarter hour), and the rest of
    the console's view."""
    console = state.telemetry.console
    snapshot = console.snapshot(since)
    if state.authenticated:
        snapshot["requests"] = [{k: v for k, v in row.items() if k != "output"} for row in snapshot["requests"]]
    snapshot["server"] = server_description(state)
    snapshot["trace_url"] = console.config.trace_url
    return JSONResponse(snapshot)
