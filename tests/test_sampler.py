"""Extreme but accepted sampling values must never break a step (one bad request would fail every other)."""

import pytest
import torch

from kernels import reference
from server.engine.request import InvalidRequestError, SamplingParams
from server.engine.sampler import Sampler, apply_penalties, refused_tokens
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
    assert Sampler(reference.greedy_tokens).sample(logits, [request]).tokens == [int(logits.argmax())]


def test_a_repetition_penalty_that_would_overflow_is_refused():
    with pytest.raises(InvalidRequestError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-300).verify(1000)


def _logits(seed: int = 0, vocab: int = 1000) -> torch.Tensor:
    return torch.randn(1, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_logprobs_come_from_the_distribution_after_penalties_and_temperature():
    logits = _logits()
    request = make_request("r", 3)
    request.output_token_ids = [5, 5, 9]
    request.sampling_params = SamplingParams(temperature=0.7, seed=1, logprobs=4, frequency_penalty=0.5,
                                             repetition_penalty=1.3, logit_bias={11: 3.0})
    out = Sampler(reference.greedy_tokens).sample(logits.clone(), [request])
    expected_logits = apply_penalties(logits[0], request)
    expected_logits[11] += 3.0
    expected = torch.log_softmax(expected_logits / 0.7, dim=-1)
    entry = out.logprobs[0]
    assert entry.token_id == out.tokens[0]
    assert entry.logprob == pytest.approx(float(expected[entry.token_id]), abs=1e-5)
    top_ids = torch.topk(expected, 4).indices.tolist()
    assert [t for t, _ in entry.top] == top_ids
    assert [lp for _, lp in entry.top] == pytest.approx(expected[top_ids].tolist(), abs=1e-5)


def test_greedy_logprobs_are_the_untempered_distribution_and_other_rows_get_none():
    logits = torch.cat([_logits(1), _logits(2)])
    wants, plain = make_request("a", 3), make_request("b", 3)
    wants.sampling_params = SamplingParams(temperature=0.0, logprobs=0)
    out = Sampler(reference.greedy_tokens).sample(logits.clone(), [wants, plain])
    expected = torch.log_softmax(logits[0], dim=-1)
    assert out.tokens == logits.argmax(dim=-1).tolist()
    assert out.logprobs[0].logprob == pytest.approx(float(expected.max()), abs=1e-5) and out.logprobs[0].top == ()
    assert out.logprobs[1] is None


def test_a_logit_bias_can_force_or_forbid_a_token():
    logits = _logits(3)
    favourite = int(logits.argmax())
    request = make_request("r", 3)
    request.sampling_params = SamplingParams(temperature=0.0, logit_bias={favourite: -100.0, 17: 100.0})
    assert Sampler(reference.greedy_tokens).sample(logits.clone(), [request]).tokens == [17]


def test_a_logit_bias_outside_the_vocabulary_or_range_is_refused():
    with pytest.raises(InvalidRequestError, match="logit_bias") as error:
        SamplingParams(logit_bias={1000: 1.0}).verify(1000)
    assert error.value.param == "logit_bias"
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        SamplingParams(logit_bias={3: 100.5}).verify(1000)
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=21).verify(1000)


def test_bitmasks_unpack_bit_t_of_word_t_over_32():
    bitmask = torch.zeros((2, 2), dtype=torch.int32)
    bitmask[0, 0] = 1 << 3
    bitmask[1, 1] = -(2**31)  # bit 31 of the second word: token 63
    allowed = ~refused_tokens(bitmask, 60 + 4)
    assert allowed[0].nonzero().view(-1).tolist() == [3]
    assert allowed[1].nonzero().view(-1).tolist() == [63]
    assert refused_tokens(bitmask, 40).shape == (2, 40)
