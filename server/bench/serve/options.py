"""The flags of ``bench serve``; kept apart from the code that runs it so that building the CLI stays light."""

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--base-url", default="http://127.0.0.1:8000")
    target.add_argument("--model", help="model name sent in requests (default: the first id of GET /v1/models)")
    target.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    target.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY)")
    target.add_argument("--compare", metavar="URL2", help="also run the same workload against this server (B)")
    target.add_argument("--compare-model", help="model name for --compare (default: the first id it lists)")
    target.add_argument("--rounds", type=int, default=1, help="alternate A and B this many times")
    target.add_argument("--extra-body", type=json_object, default={}, metavar="JSON",
                        help="fields merged into every request to A, e.g. a response_format; @FILE reads them")
    target.add_argument("--compare-extra-body", type=json_object, default={}, metavar="JSON",
                        help="the same for B; --compare at A's own URL then measures what the fields cost")
    load = parser.add_argument_group("load")
    load.add_argument("--num-prompts", type=int, default=100)
    load.add_argument("--request-rate", type=positive_float, default=float("inf"),
                      help="requests/s with Poisson arrivals, or inf to send all at once")
    load.add_argument("--max-concurrency", type=int, help="cap on requests in flight")
    load.add_argument("--seed", type=int, default=0)
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", choices=("random", "jsonl"), default="random")
    data.add_argument("--dataset-path", help='JSONL lines of {"prompt"|"messages", optional "max_tokens"}')
    data.add_argument("--input-len", type=int, default=128, help="prompt tokens of the random dataset")
    data.add_argument("--output-len", type=int, default=128, help="max_tokens, unless a JSONL line sets it")
    data.add_argument("--tokenizer", help="tokenizer.json or its folder (default: the bundled model's)")
    data.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM, Vigil)")
    out = parser.add_argument_group("results")
    out.add_argument("--slo", help="goodput limits in ms: ttft=MS,tpot=MS,e2el=MS (any subset)")
    out.add_argument("--result-json", help="default: bench-results/serve-<time>.json")
    out.add_argument("--plot-dir", help="default: the folder of the result JSON")


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def json_object(text: str) -> dict:
    """A JSON object, or ``@path`` of a file holding one."""
    try:
        value = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, json.JSONDecodeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value
