"""The execution plan (server/engine/execution_plan.py), decided once at load: every plan this CPU can run is
forced in turn on the real SmolLM2; the plan says what runs (the runner takes the compiled decode loop exactly
where the plan says so), the metric labels are the plan's, `vigil serve --print-plan` prints the same plan, the
two decode paths give the same tokens bit for bit, and a plan the model cannot run is refused at start in one
line."""

import os
import subprocess
import sys

import pytest

from kernels import cpu
from server import LLM, SamplingParams
from server.allocator import ALLOCATOR_ENV, process_allocator
from server.models.linear import fp16_weight_gemm_available
from tests.ops_stack import ROOT

pytestmark = pytest.mark.slow

COMPILED = cpu.load()
needs_compiler = pytest.mark.skipif(COMPILED is None, reason="no compiled CPU kernels: only the torch path runs")
needs_fbgemm = pytest.mark.skipif(COMPILED is None or not fp16_weight_gemm_available(),
                                  reason="no compiled kernels or no fbgemm: no fp16 weights under fp32")
PROMPTS = ["The capital of France is", "def fibonacci(n):"]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
ENGINE = {"kv_cache_memory": 32 * 2**20}


def tokens(llm: LLM) -> list[list[int]]:
    return [list(result.outputs[0].token_ids) for result in llm.generate(PROMPTS, PARAMS)]


def assert_plan_is_what_runs(llm: LLM, decode_path: str) -> None:
    engine = llm.engine
    plan = engine.runner.plan
    assert plan.decode_path == decode_path
    assert (engine.runner.one_call is not None) == (decode_path == "one-call")
    assert engine.runner.decode_graphs is None and plan.decode_graph_sizes == ()
    # vigil_engine_config_info's labels come from EngineInfo: the plan's.
    assert (engine.info.decode_path, engine.info.linear_kernels) == (plan.decode_path, plan.linear_kernel_summary)
    assert engine.info.attention_backend == plan.attention
    assert engine.info.allocator == plan.allocator == process_allocator()
    assert set(plan.linear_kernels) == {"qkv", "o_proj", "gate_up", "down", "lm_head"}


@pytest.mark.parametrize(
    ("engine", "kernel"),
    [
        pytest.param({"dtype": "bfloat16"}, "bf16", marks=needs_compiler, id="bf16"),
        pytest.param({"dtype": "float32", "weight_dtype": "float16"}, "fbgemm-fp16", marks=needs_fbgemm,
                     id="fp32-over-fp16-weights"),
        pytest.param({"dtype": "bfloat16", "quantization": "int8"}, "int8-cpp", marks=needs_compiler, id="int8"),
        pytest.param({"dtype": "bfloat16", "quantization": "int4"}, "int4-cpp", marks=needs_compiler, id="int4"),
        pytest.param({"dtype": "float32", "weight_dtype": "float32", "quantization": "int8"}, "int8-cpp",
                     marks=needs_compiler, id="int8-under-fp32"),
        pytest.param({"dtype": "bfloat16", "batch_invariant": True}, "row-invariant", marks=needs_compiler,
                     id="batch-invariant"),
        pytest.param({"dtype": "float32", "weight_dtype": "float16", "batch_invariant": True}, "fbgemm-fp16",
                     marks=needs_fbgemm, id="batch-invariant-fp32-over-fp16-weights"),
    ],
)
def test_both_decode_paths_run_as_planned_and_give_the_same_tokens(smollm_folder, engine, kernel):
    one_call = LLM(model=str(smollm_folder), decode_path="one-call", **engine, **ENGINE)
    assert_plan_is_what_runs(one_call, "one-call")
    assert all(kernel in name for name in one_call.engine.runner.plan.linear_kernels.values())
    taken = tokens(one_call)
    looped = LLM(model=str(smollm_folder), decode_path="layer-loop", **engine, **ENGINE)
    assert_plan_is_what_runs(looped, "layer-loop")
    assert looped.engine.runner.plan.decode_path_reason == "chosen with --decode-path layer-loop"
    assert tokens(looped) == taken
    assert LLM(model=str(smollm_folder), **engine, **ENGINE).engine.runner.plan.decode_path == "one-call"


@pytest.mark.parametrize(
    ("engine", "kernel", "reason"),
    [
        ({"dtype": "float32", "weight_dtype": "float32"}, "torch", "weights the compiled loop does not take"),
    ],
)
def test_plans_the_one_call_loop_cannot_take_keep_the_layer_loop_and_say_why(smollm_folder, engine, kernel, reason):
    llm = LLM(model=str(smollm_folder), **engine, **ENGINE)
    assert_plan_is_what_runs(llm, "layer-loop")
    plan = llm.engine.runner.plan
    assert kernel in plan.linear_kernels["qkv"] and reason in plan.decode_path_reason
    assert len(tokens(llm)[0]) == PARAMS.max_tokens
    with pytest.raises(ValueError, match=f"--decode-path one-call cannot run this model here: .*{reason}"):
        LLM(model=str(smollm_folder), decode_path="one-call", **engine, **ENGINE)


def serve(*flags: str) -> subprocess.CompletedProcess:
    """On the allocator this process has, so that its plan and the printed one agree (tests/test_allocator.py
    runs the server on jemalloc)."""
    return subprocess.run([sys.executable, "-m", "server", "serve", "--print-plan", *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, ALLOCATOR_ENV: "system"})  # fmt: skip


@needs_compiler
def test_print_plan_prints_the_plan_that_runs_and_serves_nothing(smollm_folder):
    printed = serve("--model", str(smollm_folder), "--dtype", "bfloat16", "--kv-cache-memory", "32MiB")
    assert printed.returncode == 0, printed.stderr
    planned = LLM(model=str(smollm_folder), dtype="bfloat16", **ENGINE).engine.runner.plan
    lines = [line.strip() for line in printed.stdout.splitlines()]
    assert lines[1:] == planned.describe()
    refused = serve("--model", str(smollm_folder), "--dtype", "float32", "--weight-dtype", "float32",
                    "--decode-path", "one-call")  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("vigil serve: ")
    assert "--decode-path one-call cannot run this model here" in refused.stderr
    no_graphs = serve("--model", str(smollm_folder), "--decode-path", "cuda-graphs", "--kv-cache-memory", "32MiB")
    assert no_graphs.returncode == 2
    assert no_graphs.stderr.strip().splitlines()[-1] == (
        "vigil serve: error: --decode-path cuda-graphs cannot run here: CUDA graphs need a CUDA device; this engine "
        "runs on cpu")
