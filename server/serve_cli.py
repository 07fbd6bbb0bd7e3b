"""``python -m server serve``: the OpenAI-compatible HTTP server, with vLLM-style flags.

On SIGTERM (or Ctrl+C) it drains: readiness and new requests answer 503 while the requests in flight finish,
for up to ``--shutdown-timeout`` seconds; whatever is still running then ends with a 503, and the process
exits 0. A second signal stops at once.
"""

import argparse
import logging
import os
import resource
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from server.engine_args import add_engine_args
from server.serve_args import add_server_args, add_telemetry_args, server_config_from_args
from server.serve_models import ServedModels, served_models_from_args
from telemetry.logging import configure_logging

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Sequence

    from server.api.draining_server import DrainingServer
    from server.api.router import ModelRouter
    from server.config import EngineConfig, ServerConfig
    from server.engine.async_engine import AsyncEngine
    from server.engine.engine import LLMEngine
    from telemetry.service import Telemetry


logger = logging.getLogger("vigil.serve")

# After the drain, the time uvicorn gives connections to finish sending what the engine stop produced.
CLOSE_GRACE_S = 5
HEAD_LIMIT_FACTOR = 4


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_server_args(parser)
    add_telemetry_args(parser)
    add_engine_args(parser, several_models=True)
    parser.add_argument("--print-plan", action="store_true",
                        help="load each model, print how its steps will run (the execution plan) and exit, "
                             "without serving")
    parser.set_defaults(func=run)


def build_telemetry(args: argparse.Namespace, models: list[str]) -> "Telemetry | None":
    if args.disable_telemetry:
        return None
    from telemetry.console import ConsoleConfig
    from telemetry.service import Telemetry, TelemetryConfig

    console = None if args.disable_console else ConsoleConfig(args.console_requests,
                                                               trace_url=args.console_trace_url)
    return Telemetry(TelemetryConfig(
        model=models[0],
        other_models=tuple(models[1:]),
        hardware_interval_s=args.hardware_interval,
        otlp_endpoint=args.otlp_endpoint,
        otlp_protocol=args.otlp_protocol,
        log_requests=args.log_requests,
        latency_buckets=args.latency_buckets,
        console=console,
    ))


def engine_loader(
    config: "EngineConfig", telemetry: "Telemetry | None", matmul_peak_flops: float | None, model: str
) -> "Callable[[], LLMEngine]":
    """What the engine's thread runs first: build the engine (the model loads), then subscribe telemetry under the
    served name ``model``, with the matmul peak that MFU is measured against (measured here when not given)."""

    def load() -> "LLMEngine":
        from server.engine.builder import build_engine

        engine = build_engine(config)
        if telemetry is not None:
            peak = matmul_peak_flops
            if peak is None:
                from kernels.matmul_peak import measure_matmul_peak

                peak = measure_matmul_peak(engine.runner.model.dtype, engine.runner.device)
            telemetry.attach(engine, peak, model)
        return engine

    return load


def print_plans(args: argparse.Namespace) -> int:
    from server.engine.builder import build_engine

    for spec in served_models_from_args(args).models:
        plan = build_engine(spec.engine).runner.plan
        print(f"{spec.name}:")
        for line in plan.describe():
            print(f"  {line}")
    return 0


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    if args.print_plan:
        return print_plans(args)
    http = build_server(args, dict(os.environ))
    try:
        http.run()
    except SystemExit as failure:  # uvicorn's start-up failure, such as a port already in use
        leave_before_a_running_engine(http.engines, failure.code)
        raise
    leave_before_a_running_engine(http.engines, 0)  # a SIGTERM or SIGINT while a model still loads
    for engine in http.engines:
        if engine.load_error is not None:
            raise engine.load_error  # server.__main__ turns it into one line and exit status 2
    return 0


def leave_before_a_running_engine(engines: "Sequence[AsyncEngine]", code: object) -> None:
    """Leaves now, without the interpreter's teardown, where an engine's thread outlived the shutdown's wait for it:
    a model still loading is C++ work on that daemon thread, and C++'s exit handlers would run under it
    (std::terminate, SIGABRT)."""
    if not any(engine.running for engine in engines):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 1)


def build_server(args: argparse.Namespace, environ: dict[str, str]) -> "DrainingServer":
    """The server, not yet serving. The flags and the models' paths are checked here (a bad one raises now); each
    model loads on its engine's thread once the server runs, while /livez, /readyz and /metrics answer."""
    import uvicorn

    from server.api.app import create_app
    from server.api.draining_server import DrainingServer
    from server.api.lifecycle import Lifecycle
    from server.models.loader import locate_model

    served = served_models_from_args(args)
    server_config = server_config_from_args(args, environ, served.models[0].name)
    for spec in served.models:
        locate_model(spec.engine.model)
    telemetry = build_telemetry(args, [spec.name for spec in served.models])
    router = build_router(served, telemetry, args.matmul_peak_flops)
    logger.info("serving %s", served.memory_split())
    lifecycle = Lifecycle()
    app = create_app(router.default.engine, server_config, lifecycle, telemetry, router=router)
    raise_open_files_limit()
    uvicorn_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        # h11, not httptools: httptools buffers request headers without bound, h11 stops at a limit. Headers
        # past max_header_bytes get an OpenAI-style 431 from the middleware; h11 cuts off (with a plain 400)
        # only heads so large that the middleware would never see them.
        http=http_protocol(server_config),
        h11_max_incomplete_event_size=HEAD_LIMIT_FACTOR * server_config.max_header_bytes,
        timeout_graceful_shutdown=CLOSE_GRACE_S,
        server_header=False,
        log_config=None,  # keep the logging that server.__main__ configured
    )
    return DrainingServer(uvicorn_config, lifecycle, router.engines, server_config.shutdown_timeout)


def build_router(served: ServedModels, telemetry: "Telemetry | None", matmul_peak_flops: float | None) -> "ModelRouter":
    """One engine per served model, and the routing aliases' policies, whose decisions telemetry counts. Several
    engines load and step on one shared device thread (server/engine/async_engine.py says why)."""
    from server.api.router import ModelRouter, ServedModel
    from server.api.routing_policy import make_policy
    from server.engine.async_engine import AsyncEngine

    device = ThreadPoolExecutor(1, thread_name_prefix="vigil-device") if len(served.models) > 1 else None
    models = [
        ServedModel(spec.name, AsyncEngine(engine_loader(spec.engine, telemetry, matmul_peak_flops, spec.name),
                                           device))
        for spec in served.models
    ]
    aliases = {alias.name: make_policy(alias.policy, alias.settings) for alias in served.aliases}
    router = ModelRouter(models, aliases, telemetry.record_route if telemetry is not None else None)
    if telemetry is not None:
        for name, policy in aliases.items():
            telemetry.metrics.add_alias(name, policy.models)
    return router


def http_protocol(config: "ServerConfig") -> "Callable[..., asyncio.Protocol]":
    """What uvicorn's ``http=`` takes: h11 with the head and body deadlines, under TLS (with its handshake deadline)
    when configured; the connection caps count from the TCP accept. TLS is not uvicorn's, which has no handshake
    deadline (server/api/tls_handshake.py)."""
    from server.api.connection_limits import ConnectionLimits
    from server.api.http_protocol import guarded_h11_protocol
    from server.api.tls_handshake import tls_context, tls_protocol_factory

    limits = ConnectionLimits(config.max_connections, config.max_connections_per_client)
    if config.tls is None:
        return guarded_h11_protocol(config.header_timeout, config.body_timeout, limits)
    http = guarded_h11_protocol(config.header_timeout, config.body_timeout, None)
    return tls_protocol_factory(http, tls_context(config.tls), config.tls_handshake_timeout, limits)


def raise_open_files_limit() -> None:
    """Up to the hard limit: every connection the caps allow needs a descriptor, and the default soft limit
    (often 1,024) is below the default connection cap."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
