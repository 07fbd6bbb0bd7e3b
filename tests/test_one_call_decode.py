"""Every layer of a step in one C++ call (server/models/one_call_decode.py, where the execution plan takes it): a
bf16 SmolLM2 takes it, over weights packed for AMX tiles (on AMX CPUs) or plain ones (the few-rows kernel and
oneDNN, as on CPUs without AMX), and its tokens, logprobs and prompt logprobs are the Python layer loop's bit for
bit: decode steps at one stream (the few-rows kernels) and at more than the few-rows limit, prompt steps (a prompt
long enough for the AMX attention tiles among them), and steps that mix decoding rows with prompt chunks (a token
budget of 16 splits the prompts), over a bf16 and an fp8 KV cache; an fp32 SmolLM2 over fbgemm's fp16 weights (the
default where fp32 computes) takes it too, over an fp16 KV cache. Where it cannot run (fp32 weights) the model keeps
the Python loop, and the compiled loop refuses weights and caches it cannot take."""

import pytest
import torch

from kernels import cpu
from server import LLM
from server.engine.request import SamplingParams
from server.models.linear import fp16_weight_gemm_available

COMPILED = cpu.load()
AMX = COMPILED is not None and COMPILED.amx_linear_usable()
needs_amx = pytest.mark.skipif(not AMX, reason="no AMX tiles here (or no C++ compiler): no AMX weights to take")

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Explain gravity to a child.",
    "def fibonacci(n):",
    "The three primary colours are",
    "Translate 'good morning' into Spanish:",
    "A short story about a lighthouse keeper:",
    "List three uses of copper.",
    # 40 tokens or more: a step with this prompt's rows attends on the AMX tiles where they run
    "A lighthouse keeper kept a log of every ship that passed, every storm that came, every gull that landed on "
    "the rail, and every letter the supply boat brought; in the spring of the last year",
]
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, logprobs=3, prompt_logprobs=2, ignore_eos=True)


def _outputs(llm: LLM, prompts: list[str]) -> list[tuple[list[int], str, str]]:
    return [(r.outputs[0].token_ids, repr(r.outputs[0].logprobs), repr(r.prompt_logprobs))
            for r in llm.generate(prompts, PARAMS)]


def _assert_one_call_gives_the_loops_outputs(llm: LLM) -> None:
    runner = llm.engine.runner
    one_call = runner.one_call
    assert one_call is not None and runner.plan.decode_path == "one-call"
    # one row: the few-rows kernels; ten: the tiles, oneDNN or fbgemm
    for prompts in (PROMPTS[:1], PROMPTS[-1:], PROMPTS):
        taken = _outputs(llm, prompts)
        runner.one_call = None
        try:
            looped = _outputs(llm, prompts)
        finally:
            runner.one_call = one_call
        assert all(logprobs != "None" and prompt_logprobs != "None" for _, logprobs, prompt_logprobs in taken)
        assert taken == looped


needs_compiler = pytest.mark.skipif(COMPILED is None, reason="no C++ compiler: no compiled kernels")
needs_fbgemm = pytest.mark.skipif(COMPILED is None or not fp16_weight_gemm_available(),
                                  reason="no C++ compiler or no fbgemm: no fp16 weights under fp32")


@pytest.mark.parametrize(
    ("weights", "kv_cache_dtype"),
    [
        pytest.param("tiles", "auto", marks=needs_amx),
        pytest.param("tiles", "fp8", marks=needs_amx),
        pytest.param("plain", "auto", marks=needs_compiler),
    ],
)
def test_a_bf16_model_decodes_in_one_call_with_the_python_loops_bits(smollm_folder, monkeypatch, weights,
                                                                      kv_cache_dtype):
    if weights == "plain":  # as on a CPU without AMX
        monkeypatch.setattr(COMPILED, "amx_linear_usable", lambda: False)
    llm = LLM(model=str(smollm_folder), dtype="bfloat16", kv_cache_dtype=kv_cache_dtype, kv_cache_memory=64 * 2**20,
              max_num_batched_tokens=16 if kv_cache_dtype == "fp8" else None)
    model = llm.engine.runner.model
    assert type(model.layers[0].attention.qkv).__name__ == ("AmxBf16WeightLinear" if weights == "tiles"
                                                             else "Bf16WeightLinear")
    _assert_one_call_gives_the_loops_outputs(llm)


@needs_fbgemm
def test_an_fp32_model_over_fp16_weights_decodes_in_one_call_with_the_python_loops_bits(smollm_folder):
    llm = LLM(model=str(smollm_folder), dtype="float32", kv_cache_memory=64 * 2**20)
    model = llm.engine.runner.model
    assert type(model.layers[0].attention.qkv).__name__ == "Fp16WeightLinear"
    assert llm.engine.runner.kv_caches[0][0].dtype == torch.float16
    _assert_one_call_gives_the_loops_outputs(llm)


def test_fp32_weights_keep_the_python_loop(llm_fp32):
    runner = llm_fp32.engine.runner
    assert runner.one_call is None and runner.plan.decode_path == "layer-loop"
    assert "weights the compiled loop does not take (torch)" in runner.plan.decode_path_reason


@needs_compiler
def test_the_compiled_loop_refuses_weights_and_caches_it_cannot_take():
    layers = COMPILED.DecodeLayers(9, 3, 64, 576, 1536, 1e-5, 0.125, False)
    norm = torch.ones(576, dtype=torch.bfloat16)
    table = torch.zeros(16, 64)
    wrong = torch.zeros(960, 576, dtype=torch.bfloat16)  # Q/K/V's size everywhere
    with pytest.raises(RuntimeError, match="of the model's sizes"):
        layers.add_layer(wrong, wrong, wrong, wrong, norm, norm, table, table, 0)
    with pytest.raises(RuntimeError):  # a tensor where fbgemm's packed weight belongs
        layers.add_fp16_layer(wrong, wrong, wrong, wrong, norm, norm, table, table, 0)
    hidden = torch.zeros(2, 576, dtype=torch.bfloat16)
    caches = [torch.zeros(4, 16, 3, 64, dtype=torch.bfloat16)]
    slots, tables = torch.zeros(2, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int32)
    lens, starts = torch.ones(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    prompts = (tables[:0], starts, lens[:0], False)  # none
    with pytest.raises(RuntimeError, match="one K and one V cache per layer"):
        layers.forward(hidden, hidden, torch.zeros(2, dtype=torch.int64), caches, caches, slots, tables, lens,
                       *prompts)
    three = (torch.zeros(3, 1, dtype=torch.int32), torch.ones(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="more decoding rows than tokens"):
        layers.forward(hidden, hidden, torch.zeros(2, dtype=torch.int64), [], [], slots, *three, *prompts)
