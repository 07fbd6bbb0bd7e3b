"""``bench serve``: its maths on hand-made records, then whole runs against the real server on 127.0.0.1."""

import asyncio
import json
import math
import time

import httpx
import pytest

from server.__main__ import main
from server.bench.local_server import free_port
from server.bench.serve.client import ChunkTimer, RequestRecord, chunk_text, http_error, read_stream
from server.bench.serve.dataset import DatasetError, jsonl_requests, load_tokenizer, random_requests
from server.bench.serve.runner import RunResult, arrival_offsets, merge_runs
from server.bench.serve.summary import SLO, distribution, parse_slo, summarize, tpot_s
from server.bench.stream_client import ErrorStatus, post_stream
from tests.api_server import shared_server

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOT_FOUND = "HTTP 404 invalid_request_error: The model `no-such-model` does not exist. This server serves: `smollm`."


def record(index: int = 0, *, ttft: float = 0.1, itl: tuple[float, ...] = (0.05, 0.05, 0.05), latency: float = 0.3,
           output: int = 4, prompt: int = 10, error: str | None = None) -> RequestRecord:
    if error is not None:
        return RequestRecord(index, start_s=0.0, latency_s=latency, error=error)
    return RequestRecord(index, start_s=0.0, ok=True, latency_s=latency, ttft_s=ttft, itl_s=list(itl),
                         prompt_tokens=prompt, output_tokens=output)


# --- summary maths -------------------------------------------------------------------------------------------

def test_distribution_is_in_milliseconds_with_interpolated_percentiles():
    stats = distribution([i / 1000 for i in range(1, 101)])  # 1 ms .. 100 ms
    assert stats.mean == pytest.approx(50.5)
    assert stats.median == pytest.approx(50.5)
    assert stats.p90 == pytest.approx(90.1)
    assert stats.p99 == pytest.approx(99.01)
    assert distribution([]) is None


def test_tpot_excludes_the_first_token_and_needs_two():
    assert tpot_s(record(ttft=0.2, latency=1.0, output=5)) == pytest.approx(0.2)
    assert tpot_s(record(output=1)) is None
    assert tpot_s(record(ttft=None, output=0)) is None


def test_summary_counts_only_completed_requests_and_pools_every_gap():
    records = [record(0, ttft=0.1, itl=(0.1, 0.3), latency=0.5, output=3, prompt=7),
               record(1, ttft=0.3, itl=(0.2,), latency=0.5, output=2, prompt=5),
               record(2, error="ReadTimeout")]
    summary = summarize(records, duration_s=2.0, slo=None)
    assert (summary.completed, summary.failed) == (2, 1)
    assert (summary.input_tokens, summary.output_tokens) == (12, 5)
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_throughput == pytest.approx(2.5)
    assert summary.total_token_throughput == pytest.approx(8.5)
    assert summary.ttft.mean == pytest.approx(200.0)
    assert summary.itl.mean == pytest.approx(200.0)  # (100 + 300 + 200) / 3 gaps, not a mean of means
    assert summary.tpot.mean == pytest.approx(200.0)  # (400 / 2 + 200 / 1) / 2
    assert summary.e2el.median == pytest.approx(500.0)
    assert summary.goodput is None


def test_goodput_counts_requests_within_every_given_limit():
    records = [record(0, ttft=0.05, latency=0.2, output=4),  # TPOT 50 ms
               record(1, ttft=0.30, latency=0.5, output=5),  # slow first token
               record(2, ttft=0.05, latency=0.95, output=4),  # TPOT 300 ms
               record(3, ttft=0.05, latency=0.06, output=1),  # one token: no TPOT to miss
               record(4, error="HTTP 500 server_error: boom")]
    assert summarize(records, 2.0, SLO(ttft=100)).goodput == pytest.approx(3 / 2)
    assert summarize(records, 2.0, SLO(ttft=100, tpot=100)).goodput == pytest.approx(2 / 2)
    assert summarize(records, 2.0, SLO(e2el=100)).goodput == pytest.approx(1 / 2)
    assert summarize(records, 2.0, SLO(tpot=1000, e2el=1000)).goodput == pytest.approx(4 / 2)


def test_parse_slo_takes_any_subset_and_rejects_the_rest():
    assert parse_slo("ttft=200, TPOT=50.5") == SLO(ttft=200.0, tpot=50.5)
    assert parse_slo("e2el=1000") == SLO(e2el=1000.0)
    assert parse_slo(None) is None
    for bad in ("itl=5", "ttft=fast", "ttft=1,ttft=2", "ttft"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_failures_are_grouped_by_reason_most_frequent_first():
    records = [record(0, error="ConnectError: refused"), record(1, error=NOT_FOUND), record(2, error=NOT_FOUND),
               record(3)]
    assert list(summarize(records, 1.0, None).failures.items()) == [(NOT_FOUND, 2), ("ConnectError: refused", 1)]


def test_http_errors_name_status_type_and_message():
    body = b'{"error": {"message": "The model `x` does not exist.", "type": "invalid_request_error", "code": null}}'
    assert http_error(404, body) == "HTTP 404 invalid_request_error: The model `x` does not exist."
    assert http_error(502, b"<html>bad gateway</html>") == "HTTP 502: <html>bad gateway</html>"
    assert http_error(503, b"") == "HTTP 503"


def test_text_comes_from_completion_text_or_chat_delta_content():
    assert chunk_text({"choices": [{"index": 0, "text": "Hi"}]}) == "Hi"
    assert chunk_text({"choices": [{"index": 0, "delta": {"content": "Yo"}}]}) == "Yo"
    assert chunk_text({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) == ""
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""


def test_arrivals_are_seeded_poisson_or_all_at_once():
    assert arrival_offsets(4, math.inf, 0) == [0.0] * 4
    offsets = arrival_offsets(2000, 10.0, 7)
    assert offsets == arrival_offsets(2000, 10.0, 7) != arrival_offsets(2000, 10.0, 8)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / 1999 == pytest.approx(0.1, rel=0.1)  # mean gap 1 / rate


def test_merged_rounds_follow_one_another_in_time():
    first = RunResult([record(0)], 2.0)
    second = RunResult([record(0)], 3.0)
    merged = merge_runs([first, second])
    assert merged.duration_s == 5.0
    assert [r.start_s for r in merged.records] == [0.0, 2.0]


def test_random_prompts_have_exactly_the_asked_token_count(smollm_folder):
    tokenizer = load_tokenizer(str(smollm_folder))
    requests = random_requests(tokenizer, 8, 33, 4, seed=3)
    assert all(len(tokenizer.encode(r.prompt, add_special_tokens=False)) == 33 for r in requests)
    assert all(r.prompt_len == 33 and r.output_len == 4 for r in requests)
    assert [r.prompt for r in requests] == [r.prompt for r in random_requests(tokenizer, 8, 33, 4, seed=3)]
    assert len({r.prompt for r in requests}) == 8


def test_jsonl_lines_cycle_and_bad_lines_name_their_place(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "a", "max_tokens": 3}\n\n{"messages": [{"role": "user", "content": "b"}]}\n')
    requests = jsonl_requests(str(path), 5, 9, "chat")
    assert [r.output_len for r in requests] == [3, 9, 3, 9, 3]
    with pytest.raises(DatasetError, match="data.jsonl:2: chat messages need --endpoint chat"):
        jsonl_requests(str(path), 2, 9, "completions")
    path.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(DatasetError, match="data.jsonl:2: not JSON"):
        jsonl_requests(str(path), 2, 9, "completions")


# --- whole runs against Vigil ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(smollm_folder):
    return shared_server(smollm_folder)


def bench(tmp_path, *flags: str) -> tuple[int, dict | None]:
    result_json = tmp_path / "result.json"
    code = main(["bench", "serve", "--result-json", str(result_json), "--plot-dir", str(tmp_path / "plots"), *flags])
    return code, json.loads(result_json.read_text()) if result_json.exists() else None


def most_in_flight(records: list[dict]) -> int:
    events = sorted([(r["start_s"], 1) for r in records] + [(r["start_s"] + r["latency_s"], -1) for r in records])
    in_flight = peak = 0
    for _, change in events:
        in_flight += change
        peak = max(peak, in_flight)
    return peak


@pytest.mark.server
def test_random_run_measures_every_request(server, tmp_path, capsys):
    code, result = bench(tmp_path, "--base-url", server.base_url, "--num-prompts", "6", "--input-len", "16",
                         "--output-len", "8", "--ignore-eos", "--max-concurrency", "3", "--slo", "e2el=600000")
    assert code == 0
    side = result["results"]["A"]
    summary, requests = side["summary"], side["requests"]
    assert side["model"] == "smollm"  # taken from /v1/models
    assert (summary["completed"], summary["failed"]) == (6, 0)
    assert summary["output_tokens"] == 6 * 8 and summary["input_tokens"] == 6 * 16
    assert summary["goodput"] == pytest.approx(summary["request_throughput"])
    for request in requests:
        assert request["ok"] and request["output_tokens"] == 8 and request["prompt_tokens"] == 16
        assert 0 < request["ttft_s"] <= request["latency_s"]
        assert 1 <= len(request["itl_s"]) <= 7
    assert most_in_flight(requests) <= 3
    assert result["config"]["request_rate"] == "inf" and "api_key" not in result["config"]
    plots = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name for p in plots] == ["result-latency-cdf.png", "result-throughput.png"]
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in plots)
    out = capsys.readouterr().out
    assert "Mean TTFT (ms)" in out and "P99 E2EL (ms)" in out and "Goodput (req/s)" in out


@pytest.mark.server
def test_compare_runs_both_sides_each_round_and_prints_ratios(server, tmp_path, capsys):
    code, result = bench(tmp_path, "--base-url", server.base_url, "--compare", f"{server.base_url}/v1",
                         "--num-prompts", "3", "--input-len", "8", "--output-len", "4", "--ignore-eos",
                         "--rounds", "2", "--request-rate", "50")
    assert code == 0
    assert [result["results"][s]["summary"]["completed"] for s in "AB"] == [6, 6]
    assert result["ratios"]["Output token throughput (tok/s)"]["B/A"] > 0
    out = capsys.readouterr().out
    assert "B ÷ A" in out and "A ÷ B" in out


@pytest.mark.server
def test_a_wrong_model_is_reported_as_failures_not_a_crash(server, tmp_path, capsys):
    code, result = bench(tmp_path, "--base-url", server.base_url, "--model", "no-such-model", "--num-prompts", "3",
                         "--input-len", "8", "--output-len", "4")
    assert code == 1
    assert result["results"]["A"]["summary"]["failures"] == {NOT_FOUND: 3}
    captured = capsys.readouterr()
    assert f"3 x {NOT_FOUND}" in captured.out and "every request to A failed" in captured.err


@pytest.mark.server
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_jsonl_dataset_runs_on_both_endpoints(server, tmp_path, endpoint):
    lines = [{"prompt": "The capital of France is", "max_tokens": 3}, {"prompt": "One, two,", "output_len": 5}]
    if endpoint == "chat":
        lines.append({"messages": [{"role": "user", "content": "Hi!"}]})
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, result = bench(tmp_path, "--base-url", server.base_url, "--endpoint", endpoint, "--dataset", "jsonl",
                         "--dataset-path", str(dataset), "--num-prompts", str(len(lines)), "--output-len", "2",
                         "--ignore-eos")
    assert code == 0
    requests = result["results"]["A"]["requests"]
    assert [r["output_tokens"] for r in requests] == [3, 5, 2][: len(lines)]
    assert all(r["ok"] and r["prompt_tokens"] > 0 for r in requests)


def test_an_unreachable_server_is_a_clear_error(tmp_path, capsys):
    code, result = bench(tmp_path, "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "2")
    assert code == 1 and result is None
    err = capsys.readouterr().err
    assert "cannot reach" in err and "Traceback" not in err


@pytest.mark.server
def test_extra_body_goes_into_every_request_of_its_side(server, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"guided_regex": "a(b"}))
    code, result = bench(tmp_path, "--base-url", server.base_url, "--compare", server.base_url, "--num-prompts", "2",
                         "--input-len", "8", "--output-len", "4", "--extra-body", '{"guided_regex": "[0-9]{12}"}',
                         "--compare-extra-body", f"@{broken}")
    assert code == 1  # every request to B failed
    a, b = (result["results"][side]["summary"] for side in "AB")
    assert (a["completed"], a["output_tokens"]) == (2, 2 * 4)  # twelve digits cannot finish in four tokens
    assert b["completed"] == 0 and all("guided_regex" in reason for reason in b["failures"])
    assert result["config"]["extra_body"] == {"guided_regex": "[0-9]{12}"}


@pytest.mark.server
def test_the_lean_client_and_httpx_time_a_stream_alike(server):
    """Plain http goes over the lean client; https over httpx (``read_stream``). Both fill a record the same way
    from the same stream, and both turn an error status into the same line."""
    body = {"model": "smollm", "prompt": [1, 2, 3, 4], "max_tokens": 6, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}

    async def both(sent_body: dict) -> list[RequestRecord]:
        records = []
        for lean in (True, False):
            record = RequestRecord(0, start_s=0.0)
            timer = ChunkTimer(record, time.perf_counter())
            try:
                if lean:
                    await post_stream(server.base_url, "/v1/completions", sent_body, {}, timer.take)
                else:
                    async with httpx.AsyncClient(base_url=server.base_url) as client:
                        await read_stream(client, "/v1/completions", sent_body, {}, timer)
            except ErrorStatus as error:
                record.error = http_error(error.status, error.body)
            timer.finish()
            records.append(record)
        return records

    for record in asyncio.run(both(body)):
        assert record.error is None and record.output_tokens == 6 and record.prompt_tokens == 4
        assert record.ttft_s is not None and record.ttft_s > 0 and 1 <= len(record.itl_s) <= 5
    lean, pooled = asyncio.run(both({**body, "model": "no-such-model"}))
    assert lean.error == pooled.error == NOT_FOUND
