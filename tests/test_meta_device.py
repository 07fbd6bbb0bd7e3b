"""A shape-only pass of the engine on PyTorch's ``meta`` device, which holds no data: the builder, the scheduler,
the model runner, the model and the torch attention backend run whole steps (chunked prefill, decodes, n-gram
guesses) with every tensor they make on the model's device.

Without a GPU it finds two mistakes a GPU would show: a tensor made on the CPU meeting the model's tensors in an
out-of-place op (meta refuses the mix as CUDA does; it does not check in-place ops or indexing, which the source
lint in test_device_safety.py covers), and a read of a device tensor's values on the step path (``.item()``,
``.tolist()``: a sync on a GPU, and nothing to read on meta). The real sampler runs, speculative verification
included: only its one transfer to the host per step is answered with fixed values, so any other read of a value
fails the run, and the count proves a step reads back once.
"""

import pytest
import torch

from kernels import reference
from server.config import EngineConfig, SpeculativeConfig
from server.engine import sampler as sampling
from server.engine.builder import build_engine
from server.engine.engine import LLMEngine
from server.engine.request import Request, SamplingParams
from server.engine.sampler import Sampler
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


class MetaSampler(Sampler):
    """The sampler on meta logits: every tensor op runs, shape only; the step's one transfer is counted and
    answered with TOKEN in every place (every guess refused, one token drawn)."""

    def __init__(self) -> None:
        super().__init__(reference.greedy_tokens)
        self.transfers: list[int] = []

    def _to_host(self, values: torch.Tensor) -> list:
        assert values.device.type == "meta" and values.dim() == 1
        self.transfers.append(values.numel())
        return [TOKEN] * values.numel()


@pytest.fixture
def meta_engine(tiny_folder) -> LLMEngine:
    engine = build_engine(EngineConfig(
        model=str(tiny_folder), device="meta", dtype="float32", max_num_batched_tokens=16,
        speculative_config=SpeculativeConfig(num_speculative_tokens=2),
    ))
    engine.runner.sampler = MetaSampler()
    return engine


def run_all(engine: LLMEngine) -> int:
    for index, (prompt, params) in enumerate(zip(PROMPTS, PARAMS, strict=True)):
        engine.add_request(engine.make_request(f"meta-{index}", prompt, params))
    steps = 0
    while engine.has_unfinished_requests():
        before = len(engine.runner.sampler.transfers)
        engine.step()
        assert len(engine.runner.sampler.transfers) - before <= 1, "one transfer to the host a step, at most"
        steps += 1
    return steps


def test_whole_steps_run_with_every_engine_tensor_on_the_model_device(meta_engine):
    assert meta_engine.runner.kv_caches[0][0].device.type == "meta"
    # 61 prompt tokens under a 16-token budget, then decodes: the steps mix chunks and single tokens.
    assert run_all(meta_engine) > 61 // 16
    block_manager = meta_engine.scheduler.block_manager
    assert block_manager.num_free_blocks == block_manager.num_blocks


def test_a_cpu_tensor_meeting_the_logits_is_caught(meta_engine, monkeypatch):
    def top_p_on_the_cpu(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
        drop = torch.zeros(logits.shape, dtype=torch.bool, device="cpu")
        return logits.masked_fill(drop, float("-inf"))

    monkeypatch.setattr(sampling, "mask_top_k_top_p", top_p_on_the_cpu)
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


class Grammar:
    """A constraint that allows tokens 0..9, or nothing (a failed grammar: its end-of-sequence stays allowed)."""

    def __init__(self, allows: bool) -> None:
        self.allows = allows

    def fill_bitmask(self, row: torch.Tensor) -> None:
        row[0] = 0x3FF if self.allows else 0


def test_every_sampler_feature_on_a_batch_reads_the_device_once():
    """Greedy, temperature, top-k, top-p, seeds, penalties, logit bias, logprobs, grammars and guesses in one
    batch: one transfer, and nothing else read (on meta any other read raises)."""
    sampler = MetaSampler()
    many = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7, top_k=5, seed=11),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=40, top_p=0.5, seed=3, logprobs=3),
        SamplingParams(temperature=0.0, repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2,
                       logit_bias={5: 2.0, 9: -1.0}, logprobs=0),
        SamplingParams(temperature=0.8, seed=5),
        SamplingParams(temperature=0.0),
    ]
    requests = []
    for index, params in enumerate(many):
        request = Request(f"r{index}", list(range(10, 20)), params, max_tokens=8, eos_token_ids=(2,))
        request.output_token_ids = [3, 4, 3][: index % 4]
        requests.append(request)
    requests[1].constraint, requests[4].constraint = Grammar(True), Grammar(False)
    guesses = [[], [], [], [], [], [7, 8, 9], [1]]
    rows = sum(len(g) + 1 for g in guesses)
    step = sampler.sample_step(torch.empty(rows, 300, device="meta"), requests, guesses)
    assert len(sampler.transfers) == 1
    assert step.appended == [[TOKEN]] * len(requests)
    assert [entry is not None for entry in step.logprobs] == [False, False, False, True, True, False, False]
    sampler.sample_step(torch.empty(3, 300, device="meta"), requests[:1] + requests[-1:], [[], [4]])
    assert len(sampler.transfers) == 2  # greedy rows alone: the token ids, read once
