"""``python -m server serve``: the OpenAI-compatible HTTP server, with vLLM-style flags.

On SIGTERM (or Ctrl+C) it drains: readiness and new requests answer 503 while the requests in flight finish,
for up to ``--shutdown-timeout`` seconds; whatever is still running then ends with a 503, and the process
exits 0. A second signal stops at once.
"""

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from server.config import ServerConfig, parse_bytes
from server.engine_args import add_engine_args, engine_config_from_args
from telemetry.logging import configure_logging
from telemetry.metrics import LATENCY_BUCKETS

if TYPE_CHECKING:
    from collections.abc import Callable

    from server.api.draining_server import DrainingServer
    from server.config import EngineConfig
    from server.engine.engine import LLMEngine
    from telemetry.service import Telemetry


API_KEYS_ENV = "VIGIL_API_KEYS"
# After the drain, the time uvicorn gives connections to finish sending what the engine stop produced.
CLOSE_GRACE_S = 5
HEAD_LIMIT_FACTOR = 4


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    defaults = ServerConfig()
    group = parser.add_argument_group("server")
    group.add_argument("--served-model-name", default=None,
                       help="the model name clients send (default: --model, or the bundled model's name)")
    group.add_argument("--host", default=defaults.host)
    group.add_argument("--port", type=int, default=defaults.port)
    group.add_argument("--api-key", action="append", default=[],
                       help=f"a key clients must send as 'Authorization: Bearer <key>'; repeatable; also "
                            f"{API_KEYS_ENV} (comma-separated) and --api-key-file")
    group.add_argument("--api-key-file", type=Path, default=None, help="a file with one API key per line")
    group.add_argument("--metrics-require-api-key", action="store_true", help="guard /metrics with the API key")
    group.add_argument("--rate-limit-rpm", type=int, default=None, help="requests per minute, per API key")
    group.add_argument("--rate-limit-tpm", type=int, default=None,
                       help="tokens (prompt + max_tokens, refunded when unused) per minute, per API key")
    group.add_argument("--max-request-bytes", type=parse_bytes, default=defaults.max_request_bytes,
                       help="largest request body, e.g. 4MiB")
    group.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout,
                       help="seconds that requests in flight get to finish after SIGTERM")
    add_telemetry_args(parser)
    add_engine_args(parser)
    parser.set_defaults(func=run)


def add_telemetry_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("telemetry")
    group.add_argument("--disable-telemetry", action="store_true",
                       help="no metrics, spans or stats lines (the engine then builds no stats at all)")
    group.add_argument("--otlp-endpoint", default=None,
                       help="send request spans over OTLP (also OTEL_EXPORTER_OTLP_ENDPOINT); off by default")
    group.add_argument("--otlp-protocol", default="grpc", choices=["grpc", "http/protobuf"])
    group.add_argument("--log-format", default="auto", choices=["auto", "json", "console"],
                       help="auto: console on a terminal, JSON lines otherwise")
    group.add_argument("--log-requests", action="store_true", help="put generated text in request_finished logs")
    group.add_argument("--hardware-interval", type=float, default=5.0,
                       help="seconds between GPU and host samples")
    group.add_argument("--matmul-peak-flops", type=float, default=None,
                       help="the torch.mm peak (FLOP/s) that model FLOPs utilisation is measured against; "
                            "measured at start when not given, 0 leaves MFU out")
    group.add_argument("--latency-buckets", type=_buckets, default=LATENCY_BUCKETS,
                       help="comma-separated upper bounds, in seconds, for the latency histograms")


def _buckets(text: str) -> tuple[float, ...]:
    bounds = tuple(sorted(float(value) for value in text.split(",") if value.strip()))
    if not bounds or bounds[0] <= 0:
        raise argparse.ArgumentTypeError("give positive, comma-separated bounds, e.g. 0.01,0.1,1,10")
    return bounds


def build_telemetry(args: argparse.Namespace, model: str) -> "Telemetry | None":
    if args.disable_telemetry:
        return None
    from telemetry.service import Telemetry, TelemetryConfig

    return Telemetry(TelemetryConfig(
        model=model,
        hardware_interval_s=args.hardware_interval,
        otlp_endpoint=args.otlp_endpoint,
        otlp_protocol=args.otlp_protocol,
        log_requests=args.log_requests,
        latency_buckets=args.latency_buckets,
    ))


def engine_loader(
    config: "EngineConfig", telemetry: "Telemetry | None", matmul_peak_flops: float | None
) -> "Callable[[], LLMEngine]":
    """What the engine's thread runs first: build the engine (the model loads), then subscribe telemetry, with
    the matmul peak that MFU is measured against (measured here when not given)."""

    def load() -> "LLMEngine":
        from server.engine.builder import build_engine

        engine = build_engine(config)
        if telemetry is not None:
            peak = matmul_peak_flops
            if peak is None:
                from kernels.matmul_peak import measure_matmul_peak

                peak = measure_matmul_peak(engine.runner.model.dtype, engine.runner.device)
            telemetry.attach(engine, peak)
        return engine

    return load


def read_api_keys(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str, ...]:
    keys = list(args.api_key)
    keys += [key.strip() for key in environ.get(API_KEYS_ENV, "").split(",")]
    if args.api_key_file is not None:
        keys += [line.strip() for line in args.api_key_file.read_text().splitlines()
                 if not line.lstrip().startswith("#")]
    return tuple(dict.fromkeys(key for key in keys if key))


def server_config_from_args(args: argparse.Namespace, environ: dict[str, str]) -> ServerConfig:
    return ServerConfig(
        served_model_name=args.served_model_name or args.model or ServerConfig.served_model_name,
        host=args.host,
        port=args.port,
        api_keys=read_api_keys(args, environ),
        metrics_require_api_key=args.metrics_require_api_key,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        max_request_bytes=args.max_request_bytes,
        shutdown_timeout=args.shutdown_timeout,
    )


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    http = build_server(args, dict(os.environ))
    http.run()
    if http.engine.load_error is not None:
        raise http.engine.load_error  # server.__main__ turns it into one line and exit status 2
    return 0


def build_server(args: argparse.Namespace, environ: dict[str, str]) -> "DrainingServer":
    """The server, not yet serving. The flags and the model's path are checked here (a bad one raises now); the
    model loads on the engine's thread once the server runs, while /livez, /readyz and /metrics answer."""
    import uvicorn

    from server.api.app import create_app
    from server.api.draining_server import DrainingServer
    from server.api.lifecycle import Lifecycle
    from server.engine.async_engine import AsyncEngine
    from server.models.loader import locate_model

    server_config = server_config_from_args(args, environ)
    engine_config = engine_config_from_args(args)
    locate_model(engine_config.model)
    telemetry = build_telemetry(args, server_config.served_model_name)
    engine = AsyncEngine(engine_loader(engine_config, telemetry, args.matmul_peak_flops))
    lifecycle = Lifecycle()
    app = create_app(engine, server_config, lifecycle, telemetry)
    uvicorn_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        # h11, not httptools: httptools buffers request headers without bound, h11 stops at a limit. Headers
        # past max_header_bytes get an OpenAI-style 431 from the middleware; h11 cuts off (with a plain 400)
        # only heads so large that the middleware would never see them.
        http="h11",
        h11_max_incomplete_event_size=HEAD_LIMIT_FACTOR * server_config.max_header_bytes,
        timeout_graceful_shutdown=CLOSE_GRACE_S,
        log_config=None,  # keep the logging that server.__main__ configured
    )
    return DrainingServer(uvicorn_config, lifecycle, engine, server_config.shutdown_timeout)

