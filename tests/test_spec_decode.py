"""Speculative decoding's parts alone: n-gram proposals, and rejection sampling that keeps the target's
distribution exactly (checked by sampling, with a fixed seed)."""

import random

import torch

from server.engine.spec_decode.ngram import NgramProposer
from server.engine.spec_decode.rejection import verify, verify_greedy

SAMPLES = 20_000


def test_the_longest_recent_match_proposes_what_followed_it():
    proposer = NgramProposer(num_tokens=3, min_n=1, max_n=3)
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1]
    # The most recent earlier match wins: [7, 8] last appeared before 10.
    assert proposer.propose([7, 8, 9, 7, 8, 10, 11, 7, 8]) == [10, 11, 7]
    # No 3-gram or 2-gram match, a 1-gram one.
    assert proposer.propose([5, 6, 9, 7, 6]) == [9, 7, 6]
    assert proposer.propose([1, 2, 3]) == []
    assert proposer.propose([4]) == []
    # A copy that reaches the end of the history goes on with what it has copied, as a loop would.
    assert proposer.propose([3, 3]) == [3, 3, 3]
    assert proposer.propose([1, 2, 9, 1, 2]) == [9, 1, 2]
    assert NgramProposer(num_tokens=5, min_n=2, max_n=2).propose([1, 2, 9, 1, 2]) == [9, 1, 2, 9, 1]
    # Fewer guesses when asked for fewer.
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2, 3], 1) == [4]


def scan(context: list[int], count: int, min_n: int, max_n: int) -> list[int]:
    """The proposal by a scan of the whole context, longest suffix first, most recent earlier match first."""
    for n in range(min(max_n, len(context) - 1), min_n - 1, -1):
        for start in range(len(context) - 1 - n, -1, -1):
            if context[start : start + n] == context[-n:]:
                follow = start + n
                return [context[follow + i % (len(context) - follow)] for i in range(count)]
    return []


def test_a_requests_index_kept_between_steps_proposes_what_a_scan_would():
    rng = random.Random(0)
    kept = NgramProposer(num_tokens=4, min_n=2, max_n=4)
    context = [rng.randrange(6) for _ in range(5)]
    proposed = 0
    for step in range(300):
        context += [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        if step == 150:
            del context[-20:]  # a stop string cuts the context short: the index starts again
        guesses = kept.propose(context, request_id="r")
        assert guesses == scan(context, 4, 2, 4)
        proposed += bool(guesses)
    assert proposed > 100
    assert set(kept.indexes) == {"r"}
    kept.forget("r")
    assert not kept.indexes


def test_greedy_verification_keeps_the_drafts_the_target_agrees_with_then_adds_its_own():
    assert verify_greedy([5, 6, 7, 8], [5, 6, 9]) == [5, 6, 7]
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert verify_greedy([4, 6], [5]) == [4]
    assert verify_greedy([4], []) == [4]


def first_token_frequencies(target: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(target.shape[1])
    for _ in range(SAMPLES):
        counts[verify(target, drafts, draft_probs, generator)[0]] += 1
    return counts / SAMPLES


def test_a_certain_proposal_leaves_the_targets_distribution_as_it_is():
    target = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]])
    frequencies = first_token_frequencies(target, [1], None)
    assert float((frequencies - target[0]).abs().max()) < 0.015


def test_a_draft_distribution_is_corrected_to_the_targets():
    target = torch.tensor([[0.6, 0.1, 0.1, 0.2], [0.25, 0.25, 0.25, 0.25]])
    draft = torch.tensor([[0.1, 0.7, 0.1, 0.1]])
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    for _ in range(SAMPLES):
        token = int(torch.multinomial(draft[0], 1, generator=generator))
        counts[verify(target, [token], draft, generator)[0]] += 1
    assert float((counts / SAMPLES - target[0]).abs().max()) < 0.015


def test_every_kept_draft_is_followed_by_exactly_one_more_token():
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert verify(target, [1, 2], None, torch.Generator().manual_seed(0)) == [1, 2, 0]
    assert verify(target, [2, 2], None, torch.Generator().manual_seed(0)) == [1]
