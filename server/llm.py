"""The offline API, in vLLM's style: ``LLM(...).generate(prompts, SamplingParams(...))``."""

import dataclasses
import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from server.config import EngineConfig
from server.engine.builder import build_engine
from server.engine.request import RequestOutput, SamplingParams

Prompt = str | list[int]

# vLLM's LLM arguments that mean nothing here, taken and dropped whatever their value: Vigil runs no model code
# from a checkpoint, picks its own tokenizer loader, captures CUDA graphs only with decode_path="cuda-graphs" (so
# enforce_eager and max_seq_len_to_capture have nothing to say), never swaps KV blocks to the CPU
# (a preempted request is recomputed), always chunks prefills and has no custom all-reduce or async output step.
IGNORED_VLLM_ARGUMENTS = frozenset({
    "trust_remote_code", "tokenizer_mode", "enforce_eager", "swap_space", "max_seq_len_to_capture",
    "disable_custom_all_reduce", "disable_async_output_proc", "disable_log_stats", "enable_chunked_prefill",
    "compilation_config", "allowed_local_media_path", "hf_token",
})
# vLLM's LLM arguments that would change the result, taken only at the value that means "as Vigil does anyway";
# any other value is a ValueError naming the argument.
NEUTRAL_VLLM_ARGUMENTS: dict[str, tuple[object, ...]] = {
    "tokenizer": (None,),  # also the model's own folder, checked in LLM.__init__
    "revision": (None,),
    "tokenizer_revision": (None,),
    "skip_tokenizer_init": (False,),
    "cpu_offload_gb": (0, 0.0),
    "hf_overrides": (None, {}),
}
_ENGINE_FIELDS = frozenset(field.name for field in dataclasses.fields(EngineConfig))


class LLM:
    def __init__(self, model: str | None = None, seed: int | None = None, **engine_args: object) -> None:
        """``model`` and every EngineConfig field, in the shapes vLLM's ``LLM`` takes them; ``seed`` seeds the
        generator that unseeded requests sample with, as in vLLM; vLLM's other arguments as listed above."""
        settings = {}
        for name, value in engine_args.items():
            if name in _ENGINE_FIELDS:
                settings[name] = value
            elif name == "tokenizer" and value is not None and value == model:
                continue
            elif name in NEUTRAL_VLLM_ARGUMENTS:
                if value not in NEUTRAL_VLLM_ARGUMENTS[name]:
                    also = " or the model's own path (the tokenizer is read from it)" if name == "tokenizer" else ""
                    raise ValueError(f"{name}={value!r} is not supported: Vigil takes only "
                                     f"{' or '.join(repr(v) for v in NEUTRAL_VLLM_ARGUMENTS[name])}{also}")
            elif name not in IGNORED_VLLM_ARGUMENTS:
                raise ValueError(f"LLM() has no argument {name!r}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ValueError(f"seed must be an integer, not {seed!r}")
            torch.manual_seed(seed)
        # Every torch call of this LLM runs on one thread of its own, whichever thread calls it. OpenMP keeps a pool
        # of workers for each thread that starts parallel work; with more pooled threads than cores, a worker spins
        # only briefly before it sleeps, and every parallel region of a decode step waits for one to wake: an LLM
        # built on one thread and called on another (a web app's executor, say) decoded 2.6x slower.
        self._torch_thread = ThreadPoolExecutor(1, thread_name_prefix="vigil-llm")
        self.engine = self._torch_thread.submit(build_engine, EngineConfig(model=model, **settings)).result()
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
        and the prompt's KV blocks are shared through the prefix cache. Calls from several threads run one after
        another.
        """
        return self._torch_thread.submit(self._generate, prompts, params, n).result()

    def _generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None,
        n: int,
    ) -> list[RequestOutput]:
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
