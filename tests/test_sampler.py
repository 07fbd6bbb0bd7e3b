"""Extreme but accepted sampling values must never break a step (one bad request would fail every other)."""

import pytest
import torch

from server.engine.request import InvalidRequestError, SamplingParams
from server.engine.sampler import Sampler
from tests.engine_helpers import make_request


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1e-300), SamplingParams(temperature=1.0, top_p=1e-300, seed=1),
     SamplingParams(temperature=0.5, top_k=1, seed=2)],
    ids=["tiny-temperature", "tiny-top-p", "top-k-1"],
)
def test_extreme_values_pick_the_most_likely_token(params):
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    request = make_request("r", 3)
    request.sampling_params = params
    assert Sampler().sample(logits, [request]) == [int(logits.argmax())]


def test_a_repetition_penalty_that_would_overflow_is_refused():
    with pytest.raises(InvalidRequestError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-300).verify(1000)
