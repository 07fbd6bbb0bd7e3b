"""Extreme but accepted sampling values must never break a step (one bad request would fail every other)."""

import pytest
import torch

from kernels import reference
from server.engine.request import InvalidRequestError, Request, SamplingParams
from server.engine.sampler import Sampler, apply_penalties, mask_top_k_top_p, refused_tokens, seeded_uniform
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
    expected_logits = apply_penalties(logits, [request])[0]
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


def _request(request_id: str, params: SamplingParams, outputs: int = 0) -> Request:
    request = make_request(request_id, 3)
    request.sampling_params, request.output_token_ids = params, list(range(outputs))
    return request


def test_a_seeded_draw_is_a_function_of_the_seed_and_the_position_alone():
    draws = [[seeded_uniform(seed, position) for position in range(64)] for seed in (0, 1, 2**40)]
    assert draws == [[seeded_uniform(seed, position) for position in range(64)] for seed in (0, 1, 2**40)]
    assert all(0.0 <= u < 1.0 for row in draws for u in row)
    assert len({u for row in draws for u in row}) == 3 * 64
    assert abs(sum(seeded_uniform(7, p) for p in range(20_000)) / 20_000 - 0.5) < 0.01


def test_a_seeded_row_draws_the_same_token_alone_and_beside_any_other_rows():
    seeded = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=17)
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.3, top_p=0.6),
              SamplingParams(temperature=0.5, top_k=3, seed=1), SamplingParams(temperature=0.0, logprobs=2,
                                                                               repetition_penalty=1.2)]
    sampler = Sampler(reference.greedy_tokens)
    for position in range(6):
        logits = _logits(position) / 2
        alone = sampler.sample(logits.clone(), [_request("s", seeded, position)]).tokens
        beside = torch.cat([_logits(10 + i) for i in range(len(others))])
        batch = torch.cat([beside[:2], logits, beside[2:]])
        requests = [_request(f"o{i}", p, 2) for i, p in enumerate(others)]
        tokens = sampler.sample(batch, requests[:2] + [_request("s", seeded, position)] + requests[2:]).tokens
        assert tokens[2] == alone[0]


def test_sampled_tokens_follow_the_distribution_after_top_k_and_top_p():
    """20,000 rows of one distribution in one call: the race draws each token as often as its probability."""
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    rows = 20_000
    cases = [
        (SamplingParams(temperature=1.0), probs),
        (SamplingParams(temperature=1.0, top_k=3), torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85),
        (SamplingParams(temperature=1.0, top_p=0.75), torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85),
        (SamplingParams(temperature=1.0, top_k=2, top_p=0.3), torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0])),
    ]
    torch.manual_seed(0)
    for params, expected in cases:
        requests = [_request("r", params)] * rows
        tokens = torch.tensor(Sampler(reference.greedy_tokens).sample(probs.log().repeat(rows, 1), requests).tokens)
        frequencies = torch.bincount(tokens, minlength=5) / rows
        assert float((frequencies - expected).abs().max()) < 0.015, params


def _masked_one_row(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The per-row definition: drop what is below the k-th logit, then what lies past top_p of the rest."""
    if 0 < top_k < logits.numel():
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


@pytest.mark.parametrize("top_p", [[1.0, 1.0, 1.0, 1.0], [0.9, 1.0, 0.3, 1e-9]])
def test_top_k_and_top_p_masks_each_row_as_it_would_be_masked_alone(top_p):
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(4)) * 2
    top_k = [10, -1, 0, 1000]
    masked = mask_top_k_top_p(logits, top_k, top_p)
    for row in range(4):
        assert torch.equal(masked[row], _masked_one_row(logits[row], top_k[row], top_p[row]))


def test_verification_keeps_each_guess_while_it_is_the_token_plain_sampling_draws():
    """A seeded request: the very tokens plain sampling gives at each position, beside a greedy request."""
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
    logits = torch.cat([_logits(20 + i) / 3 for i in range(4)])
    sampler = Sampler(reference.greedy_tokens)
    greedy = _request("g", SamplingParams(temperature=0.0), 5)
    plain = [sampler.sample(logits[i : i + 1].clone(), [_request("s", params, 5 + i)]).tokens[0] for i in range(4)]
    wrong = (plain[1] + 1) % logits.shape[1]
    for guesses, expected in (([*plain[:3]], plain), ([plain[0], wrong, plain[2]], plain[:2]), ([], plain[:1])):
        batch = torch.cat([_logits(30), logits[: len(guesses) + 1]])
        found = sampler.check_guesses(batch, [greedy, _request("s", params, 5)], [[], guesses])
        assert found == [[int(_logits(30).argmax())], expected]


def test_an_unseeded_guess_is_kept_with_its_probability_and_replaced_from_the_rest():
    """Rejection sampling of a certain proposal: guess 1 kept with p(1) = 0.4, else a token of p without 1."""
    first, after = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15]), torch.tensor([0.5, 0.0, 0.0, 0.0, 0.5])
    requests = 20_000
    logits = torch.stack([first.log(), after.log()]).repeat(requests, 1)
    torch.manual_seed(2)
    found = Sampler(reference.greedy_tokens).check_guesses(
        logits, [_request("r", SamplingParams(temperature=1.0))] * requests, [[1]] * requests)
    kept = [tokens for tokens in found if len(tokens) == 2]
    assert abs(len(kept) / requests - 0.4) < 0.015 and all(tokens[0] == 1 and tokens[1] in (0, 4) for tokens in kept)
    replaced = torch.bincount(torch.tensor([tokens[0] for tokens in found if len(tokens) == 1]), minlength=5)
    expected = torch.tensor([0.05, 0.0, 0.1, 0.3, 0.15]) / 0.6
    assert float((replaced / replaced.sum() - expected).abs().max()) < 0.02
