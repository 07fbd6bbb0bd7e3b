"""``python -m server bench offline|telemetry|http|serve|e2e|routing|spec|quant``: the engine beside Hugging Face
transformers, with telemetry on and off, or beside itself served over HTTP; ``serve`` load-tests any
OpenAI-compatible server; ``e2e`` starts Vigil's configurations and llama-server and weighs them so;
``routing`` weighs the auto alias against always the large model; ``spec`` weighs
speculative decoding against none; ``quant`` weighs quantised weights against unquantised."""

import argparse

from server.bench.end_to_end.options import add_arguments as add_e2e_args
from server.bench.routing_options import add_arguments as add_routing_args
from server.bench.serve.options import add_arguments as add_serve_args
from server.engine_args import add_engine_args


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks")
    modes = parser.add_subparsers(dest="mode", required=True)
    offline = modes.add_parser("offline", help="engine throughput vs transformers, in one run")
    _add_workload_args(offline, num_prompts=64, output_len=128)
    offline.add_argument("--hf-single-requests", type=int, default=2,
                         help="requests timed one at a time with transformers (batch 1)")
    offline.add_argument("--hf-batch-size", type=int, default=32, help="transformers' padded static batch")
    offline.add_argument("--skip-hf", action="store_true", help="time the engine alone")
    add_engine_args(offline)
    offline.set_defaults(func=run_offline)
    telemetry = modes.add_parser("telemetry", help="throughput with telemetry on and off, and /metrics render time")
    _add_workload_args(telemetry, num_prompts=32, output_len=64, rounds=3)
    add_engine_args(telemetry)
    telemetry.set_defaults(func=run_telemetry)
    http = modes.add_parser("http", help="the offline engine vs the same workload over HTTP to streaming clients")
    _add_workload_args(http, num_prompts=64, output_len=128, rounds=1, num_prompts_help=CLIENTS,
                       rounds_help="alternate offline and HTTP this many times, on fresh prompts each round")
    add_engine_args(http)
    http.set_defaults(func=run_http)
    console = modes.add_parser("console", help="HTTP throughput without the live console and with it open, alternating")
    _add_workload_args(console, num_prompts=16, output_len=64, rounds=4, num_prompts_help=CLIENTS,
                       rounds_help="rounds of each side, on the same prompts")
    add_engine_args(console)
    console.set_defaults(func=run_console)
    serve = modes.add_parser("serve", help="streaming load test of any OpenAI-compatible server: TTFT, TPOT, "
                             "ITL, throughput, goodput")
    add_serve_args(serve)
    serve.set_defaults(func=run_serve)
    spec = modes.add_parser("spec", help="n-gram speculation vs none, on repetitive and random prompts, in one run")
    _add_workload_args(spec, output_len=128, rounds=2, input_len_help="tokens of each random prompt")
    spec.add_argument("--concurrency", type=int, default=1, help="requests at a time")
    spec.add_argument("--repeats", type=int, default=2, help="times each shipped repetitive prompt is run per round")
    add_engine_args(spec)
    spec.set_defaults(func=run_spec)
    quant = modes.add_parser("quant", help="int8 and int4 weights vs unquantised: single-stream step against the "
                             "weight-read floor, and batch throughput, in one run")
    quant.add_argument("--methods", default="int8,int4", help="comma-separated --quantization methods to weigh")
    quant.add_argument("--batch", type=int, default=64, help="streams of the batch run")
    _add_workload_args(quant, output_len=64, rounds=3)
    add_engine_args(quant)
    quant.set_defaults(func=run_quant)
    e2e = modes.add_parser("e2e", help="the end-to-end table: int8, int4 and n-gram speculation against the "
                           "default, and against llama-server, at each concurrency, every server started here")
    add_e2e_args(e2e)
    e2e.set_defaults(func=run_e2e)
    routing = modes.add_parser("routing", help="a mixed workload through the auto alias vs always the large model: "
                               "CPU seconds per 1000 requests and latency")
    add_routing_args(routing)
    routing.set_defaults(func=run_routing)


CLIENTS = "also the number of concurrent clients"


def _add_workload_args(
    parser: argparse.ArgumentParser,
    *,
    output_len: int,
    num_prompts: int | None = None,
    rounds: int | None = None,
    num_prompts_help: str | None = None,
    input_len_help: str | None = None,
    rounds_help: str | None = None,
) -> None:
    """The random workload of the engine benchmarks, declared once: each mode gives its own defaults (and leaves
    out --num-prompts or --rounds where it has none)."""
    group = parser.add_argument_group("workload")
    if num_prompts is not None:
        group.add_argument("--num-prompts", type=int, default=num_prompts, help=num_prompts_help)
    group.add_argument("--input-len", type=int, default=128, help=input_len_help)
    group.add_argument("--output-len", type=int, default=output_len)
    if rounds is not None:
        group.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    group.add_argument("--seed", type=int, default=0)


def run_e2e(args: argparse.Namespace) -> int:
    from server.bench.end_to_end.run import run

    return run(args)


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
