"""lm-evaluation-harness (``lm-eval``, its ``local-completions`` model) scores a log-likelihood task, read from a
dataset file shipped here, through the server's echo and logprobs and its tokenizer routes; its numbers equal the
log-likelihoods the engine computes offline."""

import math
from pathlib import Path

import pytest

from tests.api_server import APIServer

pytestmark = [pytest.mark.server, pytest.mark.slow]

DATASET = Path(__file__).parent / "data" / "lm_eval_capitals.jsonl"
TASK = "vigil_capitals"
FP32 = ("--weight-dtype", "float32", "--kv-cache-dtype", "float32")  # as the llm_fp32 fixture


@pytest.fixture(scope="module")
def server(smollm_folder):
    server = APIServer(smollm_folder, *FP32).wait_ready()
    yield server
    server.stop()


def task_folder(tmp_path: Path) -> Path:
    (tmp_path / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {DATASET}\n"
        "test_split: test\n"
        "output_type: loglikelihood\n"
        'doc_to_text: "{{context}}"\n'
        'doc_to_target: "{{continuation}}"\n'
        "metric_list:\n  - metric: perplexity\n  - metric: acc\n"
    )
    return tmp_path


def offline_log_likelihood(llm, context: str, continuation: str) -> tuple[float, bool]:
    """As lm-eval scores a pair: the continuation's tokens are those of context + continuation after the
    context's own; their logprobs summed, and whether each was the most likely token."""
    from server.engine.request import SamplingParams

    tokenizer = llm.tokenizer
    context_ids = tokenizer.encode(context, add_special_tokens=False)
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    output = llm.generate(whole, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1))[0]
    entries = output.prompt_logprobs[len(context_ids):]
    return sum(e.logprob for e in entries), all(e.logprob >= e.top[0][1] for e in entries)


def test_lm_eval_local_completions_scores_equal_the_offline_engines(server, llm_fp32, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the task reads the shipped file; nothing from the hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"base_url={server.base_url}/v1/completions,model=smollm,tokenizer_backend=remote,"
                   "num_concurrent=1,max_retries=1",
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_folder(tmp_path))),
        log_samples=True,
    )
    samples = results["samples"][TASK]
    assert len(samples) == len(DATASET.read_text().splitlines())
    for sample in samples:
        (log_likelihood, is_greedy), = sample["resps"][0]
        expected, expected_greedy = offline_log_likelihood(llm_fp32, sample["doc"]["context"],
                                                           sample["doc"]["continuation"])
        assert log_likelihood == pytest.approx(expected, abs=1e-4), sample["doc"]
        assert is_greedy == expected_greedy
    metrics = results["results"][TASK]
    mean = sum(s["resps"][0][0][0] for s in samples) / len(samples)
    assert metrics["perplexity,none"] == pytest.approx(math.exp(-mean), rel=1e-6)
    assert 0 < metrics["acc,none"] < 1  # " Paris" is the greedy choice; " five" is not
