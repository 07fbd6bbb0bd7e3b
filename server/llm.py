"""The offline API, in vLLM's style: ``LLM(...).generate(prompts, SamplingParams(...))``."""

import itertools
from collections.abc import Sequence
from dataclasses import replace

from server.config import EngineConfig
from server.engine.builder import build_engine
from server.engine.request import RequestOutput, SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: object) -> None:
        self.engine = build_engine(EngineConfig(model=model, **engine_args))
        self._ids = itertools.count()

    @property
    def tokenizer(self):  # noqa: ANN201 - server.models.tokenizer.Tokenizer
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        n: int = 1,
    ) -> list[RequestOutput]:
        """Run every prompt to completion in one continuous batch; outputs come back in prompt order.

        With ``n > 1`` each prompt gets ``n`` sampled choices (``outputs[i]``); each is its own engine request,
        and the prompt's KV blocks are shared through the prefix cache.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        groups: list[list[str]] = []
        requests = []
        for prompt, p in zip(prompts, params_list, strict=True):
            ids = []
            for choice in range(n):
                request_id = f"offline-{next(self._ids)}"
                seeded = p if p.seed is None else replace(p, seed=p.seed + choice)
                requests.append(self.engine.make_request(request_id, prompt, seeded))
                ids.append(request_id)
            groups.append(ids)
        for request in requests:
            self.engine.add_request(request)
        finals: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    finals[output.request_id] = output
        return [merge_choices([finals[i] for i in ids]) for ids in groups]

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        token_ids = [self.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(token_ids, params)


def merge_choices(outputs: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput per prompt, its choices indexed in order."""
    first = outputs[0]
    choices = [replace(o.outputs[0], index=i) for i, o in enumerate(outputs)]
    return replace(first, outputs=choices)
