"""The whole engine on the Triton backend (interpreted on the CPU) gives the torch backend's tokens."""


from server import LLM, SamplingParams

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog and keeps on running", "解释"]


def greedy_tokens(folder, monkeypatch, backend: str) -> tuple[list[list[int]], str]:
    monkeypatch.setenv("VIGIL_ATTENTION_BACKEND", backend)
    # A small budget so that one prompt is chunked and a later chunk attends to its cached prefix.
    llm = LLM(model=str(folder), dtype="float32", kv_cache_memory=8 * 2**20, max_num_batched_tokens=8)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outputs], llm.engine.runner.model.attention.name


def test_triton_backend_matches_torch_backend_token_for_token(tiny_folder, monkeypatch):
    expected, torch_name = greedy_tokens(tiny_folder, monkeypatch, "torch")
    actual, triton_name = greedy_tokens(tiny_folder, monkeypatch, "triton")
    assert (torch_name, triton_name) == ("torch", "triton")
    assert len({tuple(t) for t in expected}) > 1
    assert actual == expected
