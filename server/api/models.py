"""GET /v1/models: the models this server serves, each behind its own engine; GET /version: which Vigil serves
them."""

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter, Depends

from server.api.auth import admit_caller
from server.api.protocol import ModelCard, ModelList, VersionInfo
from server.api.responses import ERROR_RESPONSES
from server.api.state import ServerState, State

router = APIRouter(tags=["models"], responses=ERROR_RESPONSES, dependencies=[Depends(admit_caller)])


def _card(state: ServerState, name: str) -> ModelCard:
    return ModelCard(id=name, created=state.started_at, max_model_len=state.router.engine_of(name).max_model_len)


@router.get("/v1/models", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    return ModelList(data=[_card(state, name) for name in state.router.models])


@router.get("/v1/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, state: State) -> ModelCard:
    if model not in state.router.models:
        raise state.router.not_found(model)
    return _card(state, model)


@router.get("/version", response_model=VersionInfo)
async def server_version() -> VersionInfo:
    try:
        return VersionInfo(version=version("vigil-serve"))
    except PackageNotFoundError:  # run from a source tree that was never installed
        return VersionInfo(version="unknown")
