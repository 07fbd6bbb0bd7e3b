"""The engine's flags: what ``bench http`` hands its server subprocess gives back the same EngineConfig."""

import argparse

from server.engine_args import add_engine_args, engine_config_from_args, engine_flags


def parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(argv))


def test_engine_flags_round_trip_every_setting():
    config = parse([
        "--model", "/models/llama", "--dtype", "bfloat16", "--weight-dtype", "float32", "--kv-cache-dtype", "float16",
        "--block-size", "32", "--max-num-seqs", "7", "--max-num-batched-tokens", "96", "--max-model-len", "640",
        "--kv-cache-memory", "3MiB", "--max-queue-len", "5", "--no-enable-prefix-caching", "--stop-on-repetition",
        "--cache-dir", "/tmp/vigil-cache", "--quantization", "int4", "-tp", "2",
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}',
    ])
    assert config.kv_cache_dtype == "float16" and not config.enable_prefix_caching and config.stop_on_repetition
    assert config.speculative_config.num_speculative_tokens == 3 and config.quantization == "int4"
    assert config.tensor_parallel_size == 2
    assert parse(engine_flags(config)) == config
    defaults = parse([])
    assert parse(engine_flags(defaults)) == defaults


def test_a_lookup_window_below_the_default_minimum_takes_it_as_its_minimum():
    """prompt_lookup_max alone may be 1, under the default minimum of 2: the minimum follows it down."""
    short = parse(["--speculative-config", '{"method": "ngram", "prompt_lookup_max": 1}']).speculative_config
    assert (short.prompt_lookup_min, short.prompt_lookup_max) == (1, 1)
    wide = parse(["--speculative-config", '{"method": "ngram", "prompt_lookup_max": 6}']).speculative_config
    assert (wide.prompt_lookup_min, wide.prompt_lookup_max) == (2, 6)
