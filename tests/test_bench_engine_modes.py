"""``bench quant`` and ``bench spec`` run end to end on a tiny model and print a row of figures per engine."""

import math
import re

import pytest

from server.__main__ import main

NUMBER = r"\d+(?:\.\d+)?|nan"


def rows(text: str, first_words: tuple[str, ...]) -> dict[str, list[float]]:
    found = {}
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in first_words:
            found[words[0]] = [float(n) for n in re.findall(NUMBER, " ".join(words[1:]))]
    return found


@pytest.mark.slow
def test_bench_quant_weighs_each_method_against_none(tiny_folder, capsys):
    code = main(["bench", "quant", "--model", str(tiny_folder), "--dtype", "float32", "--kv-cache-memory", "64MiB",
                 "--batch", "2", "--input-len", "16", "--output-len", "4", "--rounds", "1"])  # fmt: skip
    assert code == 0
    table = rows(capsys.readouterr().out, ("none", "int8", "int4"))
    assert set(table) == {"none", "int8", "int4"}
    weights = {name: figures[0] for name, figures in table.items()}
    assert weights["none"] > weights["int8"] > weights["int4"] > 0, "int8 and int4 read fewer weight bytes"
    assert table["none"][4] == 1.0 and all(figures[1] > 0 for figures in table.values())
    assert all(math.isnan(figures[-1]) for figures in table.values()), "the text is longer than the tiny context"


@pytest.mark.slow
def test_bench_spec_prints_both_workloads(tiny_folder, capsys):
    speculation = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 2}'
    code = main(["bench", "spec", "--model", str(tiny_folder), "--dtype", "float32", "--kv-cache-memory", "64MiB",
                 "--output-len", "8", "--input-len", "16", "--repeats", "1", "--rounds", "1",
                 "--speculative-config", speculation])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert '"num_speculative_tokens": 2' in out and '"prompt_lookup_min": 2' in out, "the engine flag is what runs"
    table = rows(out, ("repetitive", "random"))
    assert set(table) == {"repetitive", "random"}
    assert all(figures[0] > 0 and figures[1] > 0 for figures in table.values())
