"""Maps a request's ``model`` to one served model's engine: by the model's own name, or through an alias (such as
``auto``) whose routing policy (server/api/routing_policy.py) chooses among the served models."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from server.api.errors import APIError
from server.api.routing_policy import RoutingPolicy, RoutingRequest
from server.engine.async_engine import AsyncEngine

# (alias, chosen model, reason): where routing decisions are counted.
DecisionListener = Callable[[str, str, str], None]


@dataclass(frozen=True)
class ServedModel:
    name: str
    engine: AsyncEngine


@dataclass(frozen=True)
class Route:
    """The model a request goes to; ``alias`` and ``reason`` where a policy chose it."""

    model: str
    engine: AsyncEngine
    alias: str | None = None
    reason: str | None = None


class ModelRouter:
    """The served models (the first is the default, for requests that name none) and the routing aliases."""

    def __init__(
        self,
        models: Sequence[ServedModel],
        aliases: Mapping[str, RoutingPolicy] | None = None,
        on_decision: DecisionListener | None = None,
    ) -> None:
        self.models = {model.name: model for model in models}
        self.aliases = dict(aliases or {})
        self._on_decision = on_decision
        if not models or len(self.models) != len(models):
            raise ValueError("served model names must be given and different")
        for alias, policy in self.aliases.items():
            if alias in self.models:
                raise ValueError(f"the alias {alias!r} is also a served model's name")
            unknown = [name for name in policy.models if name not in self.models]
            if unknown:
                raise ValueError(f"the alias {alias!r} routes to {', '.join(unknown)}, which is not served")
        self.default = models[0]

    @property
    def engines(self) -> list[AsyncEngine]:
        return [model.engine for model in self.models.values()]

    @property
    def loading(self) -> bool:
        """Any model still loading: the server answers 503 until every one can serve."""
        return any(engine.loading for engine in self.engines)

    def route(self, requested: str | None, request: RoutingRequest) -> Route:
        """The model named, the default when none is, or an alias's choice; 404 for any other name."""
        if requested is None:
            return Route(self.default.name, self.default.engine)
        if requested in self.models:
            return Route(requested, self.models[requested].engine)
        if requested in self.aliases:
            decision = self.aliases[requested].choose(request, self._waiting)
            if self._on_decision is not None:
                self._on_decision(requested, decision.model, decision.reason)
            return Route(decision.model, self.models[decision.model].engine, requested, decision.reason)
        raise self.not_found(requested)

    def engine_of(self, requested: str | None) -> AsyncEngine:
        """The engine of a served model named (or the default); aliases choose per generation, so not here."""
        if requested is None:
            return self.default.engine
        if requested not in self.models:
            raise self.not_found(requested)
        return self.models[requested].engine

    def not_found(self, requested: str) -> APIError:
        names = ", ".join(f"`{name}`" for name in [*self.models, *self.aliases])
        return APIError(404, f"The model `{requested}` does not exist. This server serves: {names}.",
                        code="model_not_found", param="model")

    def _waiting(self, model: str) -> int:
        return self.models[model].engine.health().num_waiting
