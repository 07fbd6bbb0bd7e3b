"""The serve command's models: repeated --model/--served-model-name, or a --model-config TOML file with each
model's own engine settings over the command line's, and the combinations that are refused."""

import argparse
from pathlib import Path

import pytest

from server.engine_args import add_engine_args
from server.serve_args import add_server_args
from server.serve_models import served_models_from_args


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    add_engine_args(parser, several_models=True)
    return served_models_from_args(parser.parse_args(list(argv)))


def test_repeated_models_are_paired_with_their_names_in_order():
    served = parse("--model", "/m/a", "--served-model-name", "a", "--model", "/m/b", "--kv-cache-memory", "1GiB")
    assert [(m.name, m.engine.model) for m in served.models] == [("a", "/m/a"), ("/m/b", "/m/b")]
    assert all(m.engine.kv_cache_memory == 2**30 for m in served.models)


def test_no_model_serves_the_bundled_one():
    [model] = parse().models
    assert (model.name, model.engine.model) == ("SmolLM2-135M-Instruct", None)


def test_more_names_than_models_is_refused():
    with pytest.raises(ValueError, match="2 --served-model-name for 1 --model"):
        parse("--model", "/m/a", "--served-model-name", "a", "--served-model-name", "b")


def test_a_name_given_twice_is_refused():
    with pytest.raises(ValueError, match="a given twice"):
        parse("--model", "/m/a", "--served-model-name", "a", "--model", "/m/b", "--served-model-name", "a")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_a_model_config_file_overrides_the_engine_flags_per_model(tmp_path):
    config = write(tmp_path, """
[[model]]
name = "small"
model = "/m/small"
kv_cache_memory = "256MiB"
max_num_seqs = 8

[[model]]
name = "large"
model = "/m/large"

[[alias]]
name = "auto"
small = "small"
large = "large"
hard_patterns = ["prove"]
""")
    served = parse("--model-config", config, "--max-num-seqs", "32", "--dtype", "float32")
    small, large = served.models
    assert (small.engine.kv_cache_memory, small.engine.max_num_seqs, small.engine.dtype) == (256 * 2**20, 8, "float32")
    assert (large.engine.kv_cache_memory, large.engine.max_num_seqs) == (2 * 2**30, 32)
    [alias] = served.aliases
    assert (alias.name, alias.policy, alias.settings["hard_patterns"]) == ("auto", "small_first", ["prove"])
    assert "small: KV 256 MiB" in served.memory_split()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[model]]\nname = 'a'\n", "needs a name and a model"),
        ("[[model]]\nname = 'a'\nmodel = '/m'\nbatch = 3\n", "unknown settings batch"),
        ("[[alias]]\nname = 'auto'\n", r"give \[\[model\]\] tables"),
        ("[[model]\n", "models.toml"),
        ("[[model]]\nname = 'a'\nmodel = '/m'\n[[alias]]\nname = 'a'\n", "a given twice"),
    ],
)
def test_bad_model_config_files_are_refused(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        parse("--model-config", write(tmp_path, text))


def test_models_from_both_flags_and_a_file_are_refused(tmp_path):
    config = write(tmp_path, "[[model]]\nname = 'a'\nmodel = '/m'\n")
    with pytest.raises(ValueError, match="not both"):
        parse("--model-config", config, "--model", "/m/b")
