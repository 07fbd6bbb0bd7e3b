"""docs/architecture.md's "Which path a decode step takes" says what the execution plan decides: every decode path
the flag takes, every field the plan holds, and the reasons it gives for keeping the layer loop, in its words."""

import dataclasses
import inspect
import re

from server.config import DECODE_PATHS
from server.engine import execution_plan
from server.models import one_call_decode
from tests.ops_stack import ROOT

DOC = (ROOT / "docs/architecture.md").read_text()
SECTION = DOC.split("### Which path a decode step takes", 1)[1].split("\n## ", 1)[0]
PROSE = re.sub(r"\s+", " ", SECTION)


def test_the_section_names_every_decode_path_and_the_flag_that_chooses():
    assert "`--decode-path` (" + ", ".join(f"`{path}`" for path in DECODE_PATHS) + ")" in PROSE
    rows = re.findall(r"^\| `([a-z-]+)` \|", SECTION, re.MULTILINE)
    assert rows == [path for path in DECODE_PATHS if path != "auto"]


def test_the_section_names_what_the_plan_holds():
    described = {
        "decode_path": "decode path", "decode_path_reason": "what chose it",
        "decode_graph_sizes": "batch sizes captured", "attention": "attention backend",
        "prompt_attention": "kernel that attends prompt rows",
        "layer_ops": "layer ops", "linear_kernels": "kind of weight matrix's kernel",
        "kv_cache_dtype": "KV cache's dtype",
        "sampler": "greedy sampler's kernel", "cpu_kernels": "CPU kernels' variant",
        "tensor_parallel_size": "tensor-parallel size", "allocator": "memory allocator",
    }
    assert [field.name for field in dataclasses.fields(execution_plan.ExecutionPlan)] == list(described)
    for words in described.values():
        assert words in PROSE, words


def test_the_reasons_for_the_layer_loop_are_the_plans_own():
    code = inspect.getsource(execution_plan) + inspect.getsource(one_call_decode)
    for reason in (
        "the compiled loop has no all-reduce between layers",
        "weights the compiled loop does not take",
    ):
        assert reason in code and reason in PROSE, reason
