"""HAProxy's agent check (``agent-check`` on a server line): a plain TCP port that answers each connection with one
line, then closes it. ``up ready <weight>%`` scales the server's configured weight by how much more work this
replica can take, ``drain`` stops new requests while the ones in flight finish, and ``down`` takes the server out
while the model loads or the engine has failed. docs/fleet.md explains the choice."""

import asyncio
import logging

from server.api.readiness import ReadinessProbe
from server.engine.async_engine import AsyncEngine, EngineHealth

logger = logging.getLogger("vigil.agent_check")

# 0% would mean the same as `drain`; a fleet whose replicas are all full should still share new requests.
MIN_WEIGHT_PERCENT = 1


def load_weight_percent(health: EngineHealth) -> int:
    """100 when idle; the share of the batch slots and KV blocks left (whichever is scarcer), divided by one more
    than the number of requests waiting in the queue; never below 1."""
    batch_used = health.num_running / health.max_num_seqs if health.max_num_seqs else 1.0
    kv_used = 1.0 - health.num_free_blocks / health.num_blocks if health.num_blocks else 1.0
    headroom = 1.0 - max(batch_used, kv_used)
    return max(MIN_WEIGHT_PERCENT, round(100 * headroom / (1 + health.num_waiting)))


def agent_reply(readiness_problem: str | None, health: EngineHealth) -> str:
    """The agent's line for /readyz's verdict; what follows `#` is a description HAProxy shows in its stats."""
    if readiness_problem is None:
        # `ready` also lifts the drain that this replica's previous process may have left on the server.
        return f"up ready {load_weight_percent(health)}%"
    if readiness_problem == "draining":
        return "drain #draining"
    return f"down #{readiness_problem}"


async def serve_agent_check(readiness: ReadinessProbe, engine: AsyncEngine, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` until the returned server is closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            problem = await readiness.readiness_problem()
            writer.write(f"{agent_reply(problem, engine.health())}\n".encode())
            await writer.drain()
        except ConnectionError:
            pass  # HAProxy gave up waiting (its `timeout check`); it asks again at the next interval
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host, port)
    logger.info("HAProxy agent check on %s:%d", host, port)
    return server
