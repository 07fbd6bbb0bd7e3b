"""The line that tells an operator the server is ready, and how long its start took."""

import asyncio
import logging
import os
from pathlib import Path

from server.api.readiness import AllModelsReady
from server.api.router import ModelRouter
from server.config import ServerConfig

logger = logging.getLogger("vigil.server")
POLL_S = 0.1


def process_age_ms() -> int | None:
    """Milliseconds since this process started (from /proc), None where there is no /proc."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    started_s = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks after boot
    return round((uptime_s - started_s) * 1000)


def ready_line(config: ServerConfig, router: ModelRouter, console: bool = False) -> str:
    scheme = "https" if config.tls is not None else "http"
    models = ", ".join(f"{name}, {model.engine.info.dtype}" for name, model in router.models.items())
    age_ms = process_age_ms()
    took = "" if age_ms is None else f", {age_ms} ms from start"
    url = f"{scheme}://{config.host}:{config.port}"
    return f"ready: {url} ({models}{took})" + (f"; console: {url}/console" if console else "")


async def announce_when_ready(
    readiness: AllModelsReady, config: ServerConfig, router: ModelRouter, console: bool = False
) -> None:
    """Log the ready line the first time /readyz would answer 200; nothing if a model fails to load."""
    while (problem := await readiness.readiness_problem()) is not None:
        if problem == "engine_dead":
            return
        await asyncio.sleep(POLL_S)
    logger.info(ready_line(config, router, console))
