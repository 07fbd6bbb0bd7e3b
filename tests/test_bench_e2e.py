"""``bench e2e``: the table's cells against real servers it starts on 127.0.0.1, a peer that will not start, and
flags it refuses."""

import json
import subprocess
import sys

import pytest

from server.__main__ import main
from server.bench.end_to_end.cells import KEYS, Workload, table_cells

SMALL_RUN = ["--concurrency", "1", "--num-prompts", "2", "--rounds", "1", "--input-len", "16", "--output-len", "8"]


def test_cells_follow_the_table_at_each_concurrency_in_turn():
    cells = table_cells(["spec-repetitive", "int8", "int4-vs-llama-q4"], [1, 8], "{}")
    assert [(c.key, c.concurrency) for c in cells] == [
        ("int8", 1), ("spec-repetitive", 1), ("int4-vs-llama-q4", 1),
        ("int8", 8), ("spec-repetitive", 8), ("int4-vs-llama-q4", 8),
    ]  # fmt: skip
    int8, speculation, peer = cells[:3]
    assert int8.a.vigil_flags == ("--quantization", "int8") and int8.b.vigil_flags == ()
    assert speculation.workload is Workload.REPETITIVE and speculation.a.vigil_flags[-1] == "{}"
    assert peer.b.peer is not None and peer.title == "int4 ÷ llama-server Q4_1, c = 1"
    assert len(table_cells(list(KEYS), [1], "{}")) == len(KEYS)


@pytest.mark.server
def test_a_run_measures_both_servers_of_each_cell_and_reports_a_peer_that_will_not_start(tmp_path, capsys):
    result_json = tmp_path / "e2e.json"
    # /bin/false stands where llama-server goes: it exits at once, as a llama-server built for another CPU does.
    code = main(["bench", "e2e", "--cells", "int8,spec-repetitive,default-vs-llama-q4,default-vs-llama-bf16",
                 "--llama-server", "/bin/false", "--result-json", str(result_json), *SMALL_RUN,
                 "--rounds", "2"])  # fmt: skip
    assert code == 1, "a cell failed"
    out = capsys.readouterr().out
    cells = {cell["key"]: cell for cell in json.loads(result_json.read_text())["cells"]}
    for key in ("int8", "spec-repetitive"):
        cell = cells[key]
        a, b = cell["summaries"]["A"], cell["summaries"]["B"]
        assert (a["completed"], b["completed"], a["failed"], b["failed"]) == (4, 4, 0, 0), key
        assert a["output_tokens"] == b["output_tokens"] == 32, "ignore_eos: every request runs its 8 tokens"
        assert cell["ratio"] == pytest.approx(a["output_throughput"] / b["output_throughput"])
        low, high = min(cell["round_ratios"]), max(cell["round_ratios"])
        assert len(cell["round_ratios"]) == 2 and low > 0
        assert f"= **{cell['ratio']:.2f}×** (rounds {low:.2f}-{high:.2f}×)" in out
        assert "--max-num-seqs" in cell["commands"]["B"] and "--quantization" not in cell["commands"]["B"]
    assert cells["int8"]["commands"]["A"][-2:] == ["--quantization", "int8"]
    assert "--speculative-config" in cells["spec-repetitive"]["commands"]["A"]
    assert cells["spec-repetitive"]["summaries"]["A"]["input_tokens"] > 16, "bench spec's prompts, not random ones"
    peer = cells["default-vs-llama-q4"]
    assert peer["ratio"] is None and peer["failure"].startswith("llama-server exited with status 1 at start-up")
    assert cells["default-vs-llama-bf16"]["skipped"] == "needs --bf16-gguf"
    assert "| default ÷ llama-server BF16, c = 1 | not run: needs --bf16-gguf |" in out
    logs = result_json.with_name("e2e-logs")
    assert (logs / "c1-int8-A.log").read_text() and (logs / "c1-default-vs-llama-q4-B.log").exists()


def test_without_llama_server_its_cells_are_left_out_and_the_run_succeeds(tmp_path, capsys):
    code = main(["bench", "e2e", "--cells", "default-vs-llama-q4", "--result-json", str(tmp_path / "r.json"),
                 *SMALL_RUN])  # fmt: skip
    assert code == 0
    assert "| default ÷ llama-server Q4_1, c = 1 | not run: needs --llama-server |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cells", "int8,int9"], "unknown cell int9"),
        (["--concurrency", "1,0"], "must be at least 1, got 0"),
        (["--llama-server", "/no/such/llama-server"], "no such file: /no/such/llama-server"),
        (["--vigil-args=--dtype 'float32"], "--vigil-args"),
        (["--result-json", "/proc/e2e/r.json"], "bench e2e: [Errno"),
    ],
)
def test_bad_flags_exit_2_with_the_reason(flags, message):
    done = subprocess.run([sys.executable, "-m", "server", "bench", "e2e", *flags], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr and not done.stdout
