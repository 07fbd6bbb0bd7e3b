"""``python -m server bench offline|telemetry|http|serve|routing|spec|quant``: the engine beside Hugging Face
transformers, with telemetry on and off, or beside itself served over HTTP; ``serve`` load-tests any
OpenAI-compatible server; ``routing`` weighs the auto alias against always the large model; ``spec`` weighs
speculative decoding against none; ``quant`` weighs quantised weights against unquantised."""

import argparse

from server.bench.routing_options import add_arguments as add_routing_args
from server.bench.serve.options import add_arguments as add_serve_args
from server.engine_args import add_engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks")
    modes = parser.add_subparsers(dest="mode", required=True)
    offline = modes.add_parser("offline", help="engine throughput vs transformers, in one run")
    offline.add_argument("--num-prompts", type=int, default=64)
    offline.add_argument("--input-len", type=int, default=128)
    offline.add_argument("--output-len", type=int, default=128)
    offline.add_argument("--seed", type=int, default=0)
    offline.add_argument("--hf-single-requests", type=int, default=2,
                         help="requests timed one at a time with transformers (batch 1)")
    offline.add_argument("--hf-batch-size", type=int, default=32, help="transformers' padded static batch")
    offline.add_argument("--skip-hf", action="store_true", help="time the engine alone")
    add_engine_args(offline)
    offline.set_defaults(func=run_offline)
    telemetry = modes.add_parser("telemetry", help="throughput with telemetry on and off, and /metrics render time")
    telemetry.add_argument("--num-prompts", type=int, default=32)
    telemetry.add_argument("--input-len", type=int, default=128)
    telemetry.add_argument("--output-len", type=int, default=64)
    telemetry.add_argument("--rounds", type=int, default=3)
    telemetry.add_argument("--seed", type=int, default=0)
    add_engine_args(telemetry)
    telemetry.set_defaults(func=run_telemetry)
    http = modes.add_parser("http", help="the offline engine vs the same workload over HTTP to streaming clients")
    http.add_argument("--num-prompts", type=int, default=64, help="also the number of concurrent clients")
    http.add_argument("--input-len", type=int, default=128)
    http.add_argument("--output-len", type=int, default=128)
    http.add_argument("--seed", type=int, default=0)
    http.add_argument("--rounds", type=int, default=1,
                      help="alternate offline and HTTP this many times, on fresh prompts each round")
    add_engine_args(http)
    http.set_defaults(func=run_http)
    console = modes.add_parser("console", help="HTTP throughput without the live console and with it open, alternating")
    console.add_argument("--num-prompts", type=int, default=16, help="also the number of concurrent clients")
    console.add_argument("--input-len", type=int, default=128)
    console.add_argument("--output-len", type=int, default=64)
    console.add_argument("--seed", type=int, default=0)
    console.add_argument("--rounds", type=int, default=4, help="rounds of each side, on the same prompts")
    add_engine_args(console)
    console.set_defaults(func=run_console)
    serve = modes.add_parser("serve", help="streaming load test of any OpenAI-compatible server: TTFT, TPOT, "
                             "ITL, throughput, goodput")
    add_serve_args(serve)
    serve.set_defaults(func=run_serve)
    spec = modes.add_parser("spec", help="n-gram speculation vs none, on repetitive and random prompts, in one run")
    spec.add_argument("--output-len", type=int, default=128)
    spec.add_argument("--input-len", type=int, default=128, help="tokens of each random prompt")
    spec.add_argument("--concurrency", type=int, default=1, help="requests at a time")
    spec.add_argument("--repeats", type=int, default=2, help="times each shipped repetitive prompt is run per round")
    spec.add_argument("--rounds", type=int, default=2)
    spec.add_argument("--seed", type=int, default=0)
    add_engine_args(spec)
    spec.set_defaults(func=run_spec)
    quant = modes.add_parser("quant", help="int8 and int4 weights vs unquantised: single-stream step against the "
                             "weight-read floor, and batch throughput, in one run")
    quant.add_argument("--methods", default="int8,int4", help="comma-separated --quantization methods to weigh")
    quant.add_argument("--batch", type=int, default=64, help="streams of the batch run")
    quant.add_argument("--input-len", type=int, default=128)
    quant.add_argument("--output-len", type=int, default=64)
    quant.add_argument("--rounds", type=int, default=3)
    quant.add_argument("--seed", type=int, default=0)
    add_engine_args(quant)
    quant.set_defaults(func=run_quant)
    routing = modes.add_parser("routing", help="a mixed workload through the auto alias vs always the large model: "
                               "CPU seconds per 1000 requests and latency")
    add_routing_args(routing)
    routing.set_defaults(func=run_routing)


def run_spec(args: argparse.Namespace) -> int:
    from server.bench.speculative import run

    return run(args)


def run_quant(args: argparse.Namespace) -> int:
    from server.bench.quantization import run

    return run(args)


def run_telemetry(args: argparse.Namespace) -> int:
    from server.bench.telemetry_overhead import run

    return run(args)


def run_offline(args: argparse.Namespace) -> int:
    from server.bench.offline import run

    return run(args)


def run_http(args: argparse.Namespace) -> int:
    from server.bench.serve_http import run

    return run(args)


def run_console(args: argparse.Namespace) -> int:
    from server.bench.console_overhead import run

    return run(args)


def run_serve(args: argparse.Namespace) -> int:
    from server.bench.serve.cli import run

    return run(args)


def run_routing(args: argparse.Namespace) -> int:
    from server.bench.routing import run

    return run(args)
