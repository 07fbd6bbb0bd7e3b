"""Which proposer and draft policy a configuration asks for, and which requests speculation can serve exactly."""

from server.config import SpeculativeConfig
from server.engine.request import Request
from server.engine.spec_decode.draft_length import DraftPolicy
from server.engine.spec_decode.ngram import NgramProposer


def proposer_for(config: SpeculativeConfig | None) -> NgramProposer | None:
    if config is None:
        return None
    return NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)


def draft_policy_for(config: SpeculativeConfig | None) -> DraftPolicy | None:
    """Up to ``num_speculative_tokens`` guesses a request, as many as pay."""
    return None if config is None else DraftPolicy(config.num_speculative_tokens)


def can_speculate(request: Request) -> bool:
    """Guesses are checked against the distribution the request would sample from. Penalties would change it with
    every kept guess, a grammar must see each token, and logprobs are reported per sampled token: requests with
    any of these decode one token a step, as without speculation."""
    params = request.sampling_params
    return not (params.has_penalties or params.logit_bias or params.logprobs is not None
                or request.constraint is not None)
