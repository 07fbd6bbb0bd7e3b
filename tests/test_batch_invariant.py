"""Batch-invariant mode (``--batch-invariant``): a request's tokens do not depend on what else the engine runs.

The pieces are checked first: the row-invariant bf16 kernel gives a row the same bits at any row count, and the
attention backend gives a sequence the same bits alone, beside others, in one chunk or in many, decoding or
prefilling. Then the whole engine, on the real SmolLM2 in bf16 and in fp32: a seeded request with ``n = 3`` (the
choices share the prompt through the prefix cache) samples the same tokens alone, in the middle of a batch of other
requests, with a KV pool so small that requests are preempted and recomputed, and with every step in the Python
layer loop rather than the compiled decode loop; and a served request's ``n``
seeded choices are the same alone and while other requests stream."""

import concurrent.futures
import random

import httpx
import pytest
import torch

from kernels import cpu
from kernels.backend import AttentionBatch, BatchInvariantCpuAttention
from server import LLM
from server.config import EngineConfig
from server.engine.request import SamplingParams
from server.models.linear import fp16_weight_gemm_available
from tests.api_server import APIServer
from tests.ops_stack import wait_until

COMPILED = cpu.load()
needs_compiler = pytest.mark.skipif(COMPILED is None, reason="no C++ compiler: no compiled kernels")

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=24)
WORDS = ["cat", "river", "stone", "light", "music", "green", "old", "runs", "under", "the"]


@needs_compiler
def test_a_rows_bf16_product_is_the_same_bits_at_any_row_count() -> None:
    torch.manual_seed(0)
    weight = torch.randn(1536, 576).to(torch.bfloat16)
    x = torch.randn(40, 576).to(torch.bfloat16)
    whole = COMPILED.row_invariant_linear(x, weight)
    for rows in (1, 2, 3, 5, 8, 9, 17):
        for first in (0, 3, 20):
            assert torch.equal(COMPILED.row_invariant_linear(x[first:first + rows], weight), whole[first:first + rows])
    exact = torch.nn.functional.linear(x.float(), weight.float())
    torch.testing.assert_close(whole.float(), exact, rtol=1e-2, atol=0.3)  # bf16 output rounding at |y| ~ 50


def _paged(seq_len: int, block_size: int, first_block: int) -> list[int]:
    return list(range(first_block, first_block + (seq_len + block_size - 1) // block_size))


@needs_compiler
def test_attention_gives_a_sequence_the_same_bits_alone_chunked_decoding_or_beside_others() -> None:
    torch.manual_seed(1)
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    k_cache = torch.randn(400, block_size, kv_heads, head_dim).to(torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    backend = BatchInvariantCpuAttention(torch.device("cpu"), COMPILED)
    length = 150
    table = _paged(length, block_size, 10)
    queries = torch.randn(length, heads, head_dim).to(torch.bfloat16)

    def attend(chunk: range, others: int, rng: random.Random) -> torch.Tensor:
        """The chunk's rows, as prefill rows after ``others`` decoding sequences and beside a prefilling one."""
        decode_lens = [rng.randint(1, 300) for _ in range(others)]
        decode_tables = [_paged(n, block_size, 100 + 20 * i) for i, n in enumerate(decode_lens)]
        other_new, other_len = 7, 90
        batch = AttentionBatch(
            slot_mapping=[],
            decode_block_tables=decode_tables,
            decode_seq_lens=decode_lens,
            prefill_block_tables=[_paged(other_len, block_size, 350), table],
            prefill_query_starts=[0, other_new, other_new + len(chunk)],
            prefill_seq_lens=[other_len, chunk.stop],
        )
        beside = torch.randn(others + other_new, heads, head_dim).to(torch.bfloat16)
        q = torch.cat([beside, queries[chunk.start:chunk.stop]])
        meta = backend.prepare(batch)
        assert meta.num_decode_tokens == 0
        out = backend.prefill(q, q, q, k_cache, v_cache, meta, head_dim**-0.5)
        return out[others + other_new:]

    rng = random.Random(0)
    whole = attend(range(0, length), 0, rng)
    for cuts in ([0, 37, length], [0, 16, 100, 149, length], list(range(length + 1))):
        for others in (0, 5):
            pieces = [attend(range(a, b), others, rng) for a, b in zip(cuts, cuts[1:], strict=False)]
            assert torch.equal(torch.cat(pieces), whole)
    decoding_last = BatchInvariantCpuAttention(torch.device("cpu"), COMPILED)
    meta = decoding_last.prepare(AttentionBatch([], [table], [length], [], [0], []))
    last = decoding_last.prefill(queries[-1:], queries, queries, k_cache, v_cache, meta, head_dim**-0.5)
    assert torch.equal(last, whole[-1:])


def _others(
    count: int, rng: random.Random, words: int = 120, tokens: int = 32
) -> tuple[list[str], list[SamplingParams]]:
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(10, words))) for _ in range(count)]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=rng.randint(4, tokens)) for i in range(count)]
    return prompts, params


def _choices(llm: LLM, others: int) -> list[list[int]]:
    """The seeded request's three choices, run alone (``others`` 0) or in the middle of ``others`` requests."""
    prompts, params = _others(others, random.Random(others))
    half = others // 2
    outputs = llm.generate(prompts[:half] + [PROMPT] + prompts[half:], params[:half] + [SEEDED] + params[half:], n=3)
    return [list(choice.token_ids) for choice in outputs[half].outputs]


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_seeded_choices_are_the_same_alone_in_a_batch_and_when_preempted(smollm_folder, dtype: str) -> None:
    if dtype == "float32" and not fp16_weight_gemm_available():
        pytest.skip("no fbgemm: fp32 compute has no fp16-weight GEMM here")
    llm = LLM(smollm_folder, dtype=dtype, max_num_seqs=32, batch_invariant=True)
    # All-decode steps take the compiled loop, steps with prompt rows the layer loop: both in this mode's kernels.
    assert llm.engine.runner.one_call is not None and llm.engine.runner.plan.decode_path == "one-call"
    alone = _choices(llm, 0)
    assert len({tuple(choice) for choice in alone}) > 1  # seed + choice: the choices are sampled, not copies
    assert _choices(llm, 24) == alone
    looped = LLM(smollm_folder, dtype=dtype, max_num_seqs=32, batch_invariant=True, decode_path="layer-loop")
    assert _choices(looped, 0) == alone
    small = LLM(smollm_folder, dtype=dtype, max_num_seqs=32, batch_invariant=True, kv_cache_memory=5 * 2**20)
    preempt = small.engine.scheduler._preempt
    preempted = []
    small.engine.scheduler._preempt = lambda request: (preempted.append(request.request_id), preempt(request))
    assert _choices(small, 24) == alone
    assert preempted  # a pool of about 14 blocks cannot hold the batch: requests were recomputed


REPETITIVE = ("The list: apples, pears, plums, apples, pears, plums, apples, pears, plums, apples, pears, plums, "
              "apples, pears, plums, apples, pears")


@needs_compiler
@pytest.mark.slow
def test_greedy_and_seeded_tokens_are_the_same_with_n_gram_speculation_in_bf16(smollm_folder) -> None:
    """The third check: speculation verifies guesses in chunks of several tokens (the prefill attention path, and
    several rows a request through the GEMMs and the logits), and a seeded token is drawn as plain decoding draws
    it at that position. The request speculates alone and in the middle of 63 others that speculate too. Without
    the mode, bf16 greedy parted at token 8 here."""
    memory = 512 * 2**20
    plain = LLM(smollm_folder, dtype="bfloat16", batch_invariant=True, kv_cache_memory=memory)
    speculative = LLM(smollm_folder, dtype="bfloat16", batch_invariant=True, kv_cache_memory=memory,
                      speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4})
    kept: list[int] = []
    speculative.engine.stats_listeners.append(lambda stats: kept.append(stats.num_accepted_tokens))
    prompts, params = _others(63, random.Random(63), words=40, tokens=24)
    for wanted in (SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
                   SamplingParams(temperature=0.8, seed=7, max_tokens=64, ignore_eos=True)):
        [alone] = plain.generate(REPETITIVE, wanted)
        [verified] = speculative.generate(REPETITIVE, wanted)
        assert verified.outputs[0].token_ids == alone.outputs[0].token_ids, wanted
        before = sum(kept)
        batch = speculative.generate(prompts[:31] + [REPETITIVE] + prompts[31:], params[:31] + [wanted] + params[31:])
        assert batch[31].outputs[0].token_ids == alone.outputs[0].token_ids, wanted
        assert sum(kept) > before, "speculation must have kept guesses in the batch for this to test anything"
    assert sum(kept) > 16


def test_batch_invariant_mode_refuses_quantized_weights() -> None:
    with pytest.raises(ValueError, match="batch-invariant mode"):
        EngineConfig(batch_invariant=True, quantization="int8")


def _seeded_completion(base_url: str) -> list[str]:
    body = {"model": "smollm", "prompt": PROMPT, "n": 3, "seed": 1234, "temperature": 0.8, "top_p": 0.95,
            "max_tokens": 40}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    return [choice["text"] for choice in sorted(response.json()["choices"], key=lambda choice: choice["index"])]


@needs_compiler
@pytest.mark.server
def test_a_served_seeded_request_with_n_choices_is_the_same_alone_and_under_load(smollm_folder) -> None:
    server = APIServer(smollm_folder, "--dtype", "bfloat16", "--batch-invariant").wait_ready()
    pool = concurrent.futures.ThreadPoolExecutor(8)
    try:
        info = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        assert 'attention_backend="cpu-batch-invariant"' in info
        alone = _seeded_completion(server.base_url)
        assert len(set(alone)) > 1
        prompts, _ = _others(8, random.Random(8))
        load = [pool.submit(httpx.post, f"{server.base_url}/v1/completions", timeout=300,
                            json={"model": "smollm", "prompt": p, "max_tokens": 48, "temperature": 1.0})
                for p in prompts]  # fmt: skip
        wait_until(lambda: server.engine_state()["num_unfinished"] >= 4, 60, interval=0.05,
                   what="other requests are in the engine")  # fmt: skip
        assert _seeded_completion(server.base_url) == alone
        assert all(future.result().status_code == 200 for future in load)
        server.wait_all_blocks_free()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        server.stop()
