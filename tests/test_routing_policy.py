"""The routing policy on its own, and the model router over fake engines: every reason, overflow under load, the
404 that lists the served names, and settings that cannot work."""

from dataclasses import dataclass

import pytest

from server.api.errors import APIError
from server.api.router import ModelRouter, ServedModel
from server.api.routing_policy import RoutingRequest, SmallFirstPolicy, make_policy

POLICY = SmallFirstPolicy("small", "large", max_small_prompt_chars=100, max_small_tokens=64,
                          hard_patterns=("prove", r"step\s+by\s+step"), overflow_waiting=3)


def request(text: str = "Hello", max_tokens: int | None = 16) -> RoutingRequest:
    return RoutingRequest(text, len(text), max_tokens)


def idle(model: str) -> int:
    return 0


@pytest.mark.parametrize(
    ("routed", "model", "reason"),
    [
        (request(), "small", "simple"),
        (request(max_tokens=None), "small", "simple"),
        (request("x" * 101), "large", "long_prompt"),
        (request(max_tokens=65), "large", "long_output"),
        (request("Please PROVE that"), "large", "hard_rule"),
        (request("think step  by step"), "large", "hard_rule"),
    ],
)
def test_each_reason(routed, model, reason):
    decision = POLICY.choose(routed, idle)
    assert (decision.model, decision.reason) == (model, reason)


def test_a_long_queue_on_the_large_model_overflows_hard_requests_to_the_small_one():
    queues = {"small": 0, "large": 3}
    decision = POLICY.choose(request("prove it"), queues.__getitem__)
    assert (decision.model, decision.reason) == ("small", "overflow")
    queues["large"] = 2
    assert POLICY.choose(request("prove it"), queues.__getitem__).model == "large"
    # Simple requests go to the small model whatever the load.
    assert POLICY.choose(request(), queues.__getitem__).reason == "simple"


def test_without_overflow_hard_requests_wait_for_the_large_model():
    policy = SmallFirstPolicy("small", "large", hard_patterns=("prove",))
    assert policy.choose(request("prove it"), lambda model: 1000).model == "large"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"small": "a", "large": "a"}, "two different models"),
        ({"small": "a", "large": "b", "hard_patterns": ["("]}, "hard_patterns"),
        ({"small": "a", "large": "b", "overflow_waiting": 0}, "overflow_waiting"),
        ({"small": "a", "large": "b", "budget": 3}, "budget"),
    ],
)
def test_settings_that_cannot_work_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        make_policy("small_first", settings)


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy 'cheapest'"):
        make_policy("cheapest", {})


@dataclass
class FakeHealth:
    num_waiting: int


@dataclass
class FakeEngine:
    waiting: int = 0
    loading: bool = False

    def health(self) -> FakeHealth:
        return FakeHealth(self.waiting)


def test_the_router_sends_names_aliases_and_none_to_their_engines():
    small, large = FakeEngine(), FakeEngine(waiting=5)
    decisions = []
    router = ModelRouter([ServedModel("small", small), ServedModel("large", large)], {"auto": POLICY},
                         lambda *decision: decisions.append(decision))
    assert router.route(None, request()).engine is small
    assert router.route("large", request()).engine is large
    routed = router.route("auto", request("prove it"))
    assert (routed.model, routed.engine, routed.alias, routed.reason) == ("small", small, "auto", "overflow")
    assert decisions == [("auto", "small", "overflow")]  # named models are not routing decisions


def test_an_unknown_model_is_a_404_listing_what_is_served():
    router = ModelRouter([ServedModel("small", FakeEngine()), ServedModel("large", FakeEngine())], {"auto": POLICY})
    with pytest.raises(APIError) as raised:
        router.route("gpt-4", request())
    error = raised.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert "`small`, `large`, `auto`" in error.message


def test_the_server_is_loading_while_any_model_loads():
    router = ModelRouter([ServedModel("small", FakeEngine()), ServedModel("large", FakeEngine(loading=True))])
    assert router.loading


@pytest.mark.parametrize(
    ("models", "aliases", "message"),
    [
        (["a", "a"], {}, "different"),
        (["small", "large"], {"small": POLICY}, "also a served model"),
        (["small", "other"], {"auto": POLICY}, "large, which is not served"),
    ],
)
def test_inconsistent_routers_are_refused(models, aliases, message):
    with pytest.raises(ValueError, match=message):
        ModelRouter([ServedModel(name, FakeEngine()) for name in models], aliases)
