"""The perplexity of an engine's model on a fixed text, to weigh what quantisation costs in quality.

The text (server/bench/texts/perplexity.txt) is public domain: the opening of the US Declaration of Independence
and the Gettysburg Address. It goes to the engine as one request that asks for its prompt's logprobs, as any
client could, so it runs through the engine's own scheduler, model, kernels and KV cache.
"""

import math
import uuid
from importlib.resources import files

from server.engine.engine import LLMEngine
from server.engine.request import SamplingParams, TokenLogprob

TEXT = files("server.bench") / "texts" / "perplexity.txt"


def perplexity(engine: LLMEngine, token_ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of every token after the first, which nothing predicts. The engine
    must be idle, as the steps run here would swallow other requests' outputs. Raises ValueError (the engine's
    InvalidRequestError) when the text and one output token do not fit the model's context."""
    if engine.has_unfinished_requests():
        raise RuntimeError("perplexity needs an idle engine")
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    engine.add_request(engine.make_request(f"perplexity-{uuid.uuid4().hex}", token_ids, params))
    prompt_logprobs: list[TokenLogprob | None] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                prompt_logprobs = output.prompt_logprobs or []
    total = -sum(entry.logprob for entry in prompt_logprobs[1:] if entry is not None)
    return math.exp(total / (len(token_ids) - 1))


def text_perplexity(engine: LLMEngine) -> float:
    return perplexity(engine, engine.tokenizer.encode(TEXT.read_text()))
