"""GET /v1/models: the one model this server serves; GET /version: which Vigil serves it."""

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

from server.api.errors import APIError
from server.api.protocol import ModelCard, ModelList, VersionInfo
from server.api.responses import ERROR_RESPONSES
from server.api.state import ServerState, State

router = APIRouter(tags=["models"], responses=ERROR_RESPONSES)


def _card(state: ServerState) -> ModelCard:
    return ModelCard(id=state.config.served_model_name, created=state.started_at,
                     max_model_len=state.engine.max_model_len)


@router.get("/v1/models", response_model=ModelList)
async def list_models(state: State) -> ModelList:
    return ModelList(data=[_card(state)])


@router.get("/v1/models/{model:path}", response_model=ModelCard)
async def get_model(model: str, state: State) -> ModelCard:
    if model != state.config.served_model_name:
        raise APIError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")
    return _card(state)


@router.get("/version", response_model=VersionInfo)
async def server_version() -> VersionInfo:
    try:
        return VersionInfo(version=version("vigil-serve"))
    except PackageNotFoundError:  # run from a source tree that was never installed
        return VersionInfo(version="unknown")
