"""Test-only routes, mounted only when the server starts with VIGIL_ENABLE_TEST_HOOKS=1, and kept out of the
OpenAPI schema: inject an engine fault, and read the KV pool's state from outside the process."""

from fastapi import APIRouter, Depends

from server.api.auth import require_api_key
from server.api.state import State

router = APIRouter(prefix="/test", dependencies=[Depends(require_api_key)], include_in_schema=False)


@router.post("/engine-fault")
async def inject_engine_fault(state: State) -> dict[str, bool]:
    state.engine.inject_fault()
    return {"injected": True}


@router.get("/engine-state")
async def engine_state(state: State) -> dict[str, int]:
    health = state.engine.health()
    return {
        "num_unfinished": health.num_unfinished,
        "num_free_blocks": health.num_free_blocks,
        "num_blocks": health.num_blocks,
        "num_steps": health.num_steps,
        "in_flight": state.lifecycle.in_flight,
    }
