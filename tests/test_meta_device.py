"""A shape-only pass of the engine on PyTorch's ``meta`` device, which holds no data: the builder, the scheduler,
the model runner, the model and the torch attention backend run whole steps (chunked prefill, decodes, n-gram
guesses) with every tensor they make on the model's device.

Without a GPU it finds two mistakes a GPU would show: a tensor made on the CPU meeting the model's tensors in an
out-of-place op (meta refuses the mix as CUDA does; it does not check in-place ops or indexing, which the source
lint in test_device_safety.py covers), and a read of a device tensor's values on the step path (``.item()``,
``.tolist()``: a sync on a GPU, and nothing to read on meta). The sampler must read the logits to draw a token,
so a shape-only sampler stands in: it runs the sampler's tensor-building parts (penalties, logit bias, top-k and
top-p masks) on the meta logits and returns a fixed token.
"""

import pytest
import torch

from kernels import reference
from server.config import EngineConfig, SpeculativeConfig
from server.engine import sampler as sampling
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine.request import Request, SamplingParams
from server.engine.sampler import Sampler, SamplerOutput, _draw_at
from server.models.decoder import DecoderModel

TOKEN = 42
PROMPTS = [list(range(100, 100 + n)) for n in (3, 40, 17, 1)]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5,
                   logit_bias={7: 3.0}, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.5, max_tokens=6, ignore_eos=True),
]


class ShapeOnlySampler(Sampler):
    def sample(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        logits = logits.float()
        for row, request in enumerate(requests):
            params = request.sampling_params
            if params.has_penalties:
                sampling.apply_penalties(logits[row], request)
            if params.logit_bias:
                sampling.apply_logit_bias(logits[row], params.logit_bias)
            sampling._top_k_top_p(logits[row], params)
        return SamplerOutput([TOKEN] * len(requests), [None] * len(requests))

    def check_guesses(self, logits: torch.Tensor, request: Request, guesses: list[int]) -> list[int]:
        return [TOKEN]  # every guess refused, one token drawn


@pytest.fixture
def meta_engine(tiny_folder) -> LLMEngine:
    engine = build_engine(EngineConfig(
        model=str(tiny_folder), device="meta", dtype="float32", max_num_batched_tokens=16,
        speculative_config=SpeculativeConfig(num_speculative_tokens=2),
    ))
    engine.runner.sampler = ShapeOnlySampler(reference.greedy_tokens)
    return engine


def run_all(engine: LLMEngine) -> int:
    for index, (prompt, params) in enumerate(zip(PROMPTS, PARAMS, strict=True)):
        engine.add_request(engine.make_request(f"meta-{index}", prompt, params))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps


def test_whole_steps_run_with_every_engine_tensor_on_the_model_device(meta_engine):
    assert meta_engine.runner.kv_caches[0][0].device.type == "meta"
    # 61 prompt tokens under a 16-token budget, then decodes: the steps mix chunks and single tokens.
    assert run_all(meta_engine) > 61 // 16
    block_manager = meta_engine.scheduler.block_manager
    assert block_manager.num_free_blocks == block_manager.num_blocks


def test_a_cpu_tensor_meeting_the_logits_is_caught(meta_engine, monkeypatch):
    def top_p_on_the_cpu(logits: torch.Tensor, top_p: float) -> torch.Tensor:
        drop = torch.zeros(logits.shape, dtype=torch.bool, device="cpu")
        return logits.masked_fill(drop, float("-inf"))

    monkeypatch.setattr(sampling, "mask_top_p", top_p_on_the_cpu)
    with pytest.raises(RuntimeError, match="device"):
        run_all(meta_engine)


def test_a_value_read_on_the_step_path_is_caught(meta_engine, monkeypatch):
    real_forward = DecoderModel.forward

    def forward_reading_positions(self, input_ids, positions, kv_caches, meta):
        int(positions.max())  # a host sync per step on a GPU
        return real_forward(self, input_ids, positions, kv_caches, meta)

    monkeypatch.setattr(DecoderModel, "forward", forward_reading_positions)
    with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
        run_all(meta_engine)


def test_the_seeded_generator_is_made_on_the_probabilities_device():
    """On meta no generator can be made at all: the attempt shows the device it was asked for."""
    with pytest.raises(RuntimeError, match="META"):
        _draw_at(torch.ones(4, device="meta"), seed=3, position=0)
    assert [_draw_at(torch.ones(4), seed=3, position=p) for p in range(8)] == [
        _draw_at(torch.ones(4), seed=3, position=p) for p in range(8)]  # the seed and the position, nothing else
