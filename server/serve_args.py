"""The serve command's flags (server, security, telemetry), and the ServerConfig they make."""

import argparse
from pathlib import Path

from server.argument_types import positive_int
from server.config import JWTConfig, ServerConfig, TLSConfig, parse_bytes
from server.config_values import LATENCY_BUCKETS, SLO_LATENCY_THRESHOLDS_S, TOOL_PARSER_NAMES

API_KEYS_ENV = "VIGIL_API_KEYS"


def add_server_args(parser: argparse.ArgumentParser) -> None:
    defaults = ServerConfig()
    group = parser.add_argument_group("server")
    group.add_argument("--served-model-name", action="append", default=None,
                       help="the model name clients send (default: --model, or the bundled model's name); once per "
                            "--model, in the same order")
    group.add_argument("--model-config", default=None,
                       help="a TOML file of the models to serve, each with its own engine settings, and of routing "
                            "aliases such as auto (docs/api.md); instead of --model")
    group.add_argument("--host", default=defaults.host)
    group.add_argument("--port", type=int, default=defaults.port)
    group.add_argument("--rate-limit-rpm", type=int, default=None, help="requests per minute, per tenant")
    group.add_argument("--rate-limit-tpm", type=int, default=None,
                       help="tokens (prompt + max_tokens, refunded when unused) per minute, per tenant")
    group.add_argument("--max-request-bytes", type=parse_bytes, default=defaults.max_request_bytes,
                       help="largest request body, e.g. 4MiB")
    group.add_argument("--header-timeout", type=float, default=defaults.header_timeout,
                       help="seconds a client gets to send a whole request head; then 408 and the connection closes")
    group.add_argument("--body-timeout", type=float, default=defaults.body_timeout,
                       help="seconds a client gets to send a whole request body after its head; then 408 and the "
                            "connection closes")
    group.add_argument("--max-connections", type=int, default=defaults.max_connections,
                       help="connections open at once; one more gets 503 and is closed")
    group.add_argument("--max-connections-per-client", type=int, default=defaults.max_connections_per_client,
                       help="connections open at once from one client address; one more gets 503 and is closed; "
                            "0: no cap (behind a proxy, set 0 or at least the proxy's maxconn)")
    group.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout,
                       help="seconds that requests in flight get to finish after SIGTERM")
    group.add_argument("--agent-port", type=int, default=None,
                       help="answer HAProxy's agent check on this TCP port: a weight from the queue and KV usage, "
                            "drain while draining, down while not ready (docs/fleet.md)")
    group.add_argument("--tool-call-parser", default=defaults.tool_call_parser, choices=sorted(TOOL_PARSER_NAMES),
                       help="the format the model writes tool calls in, for tool_choice auto")
    _add_auth_args(parser)
    _add_tls_args(parser)


def _add_auth_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("authentication")
    group.add_argument("--api-key", action="append", default=[],
                       help=f"a key clients must send as 'Authorization: Bearer <key>'; repeatable; also "
                            f"{API_KEYS_ENV} (comma-separated) and --api-key-file")
    group.add_argument("--api-key-file", type=Path, default=None, help="a file with one API key per line")
    group.add_argument("--jwt-jwks", default=None,
                       help="accept JWTs (RS256, ES256 or EdDSA) signed by the keys of this JWKS file or http(s) URL")
    group.add_argument("--jwt-issuer", default=None, help="the iss every JWT must carry")
    group.add_argument("--jwt-audience", default=None, help="the aud every JWT must carry")
    group.add_argument("--jwt-tenant-claim", default="sub", help="the JWT claim that names the caller's tenant")
    group.add_argument("--jwt-leeway", type=float, default=30.0, help="seconds of clock skew allowed for exp, nbf, iat")
    group.add_argument("--jwt-jwks-refresh", type=float, default=300.0,
                       help="seconds between reads of the JWKS (an unknown key id reads it again sooner)")
    group.add_argument("--metrics-require-api-key", action="store_true", help="guard /metrics with authentication")
    group.add_argument("--share-prefix-cache-across-tenants", action="store_true",
                       help="let every tenant hit every other tenant's cached prompt prefixes; faster for shared "
                            "system prompts, but a tenant can then time whether a prompt was sent by another")


def _add_tls_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS")
    group.add_argument("--ssl-keyfile", default=None, help="serve HTTPS with this private key")
    group.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (chain)")
    group.add_argument("--ssl-ca-certs", default=None, help="CA certificates that client certificates must chain to")
    group.add_argument("--ssl-cert-reqs", type=int, default=0, choices=[0, 1, 2],
                       help="client certificates: 0 none, 1 optional, 2 required")
    group.add_argument("--tls-handshake-timeout", type=float, default=ServerConfig().tls_handshake_timeout,
                       help="seconds a client gets to finish the TLS handshake; then the connection closes")


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
    group.add_argument("--disable-console", action="store_true",
                       help="no live console at /console (and no ring of series behind it)")
    group.add_argument("--console-requests", type=positive_int, default=50,
                       help="finished requests the console's table lists, newest first")
    group.add_argument("--console-trace-url", default=None,
                       help="link the console's trace ids to a trace UI: its address of one trace, with {trace_id} "
                            "in it, e.g. http://localhost:16686/trace/{trace_id}")


def _buckets(text: str) -> tuple[float, ...]:
    bounds = tuple(sorted(float(value) for value in text.split(",") if value.strip()))
    if not bounds or bounds[0] <= 0:
        raise argparse.ArgumentTypeError("give positive, comma-separated bounds, e.g. 0.01,0.1,1,10")
    missing = [threshold for threshold in SLO_LATENCY_THRESHOLDS_S if threshold not in bounds]
    if missing:
        raise argparse.ArgumentTypeError(
            f"the bounds must include the latency SLOs' thresholds {', '.join(f'{t:g}' for t in missing)} "
            "(alerts/slo.yml): without them the latency SLO alerts see no slow request")
    return bounds


def read_api_keys(args: argparse.Namespace, environ: dict[str, str]) -> tuple[str, ...]:
    keys = list(args.api_key)
    keys += [key.strip() for key in environ.get(API_KEYS_ENV, "").split(",")]
    if args.api_key_file is not None:
        keys += [line.strip() for line in args.api_key_file.read_text().splitlines()
                 if not line.lstrip().startswith("#")]
    return tuple(dict.fromkeys(key for key in keys if key))


def server_config_from_args(args: argparse.Namespace, environ: dict[str, str], served_model_name: str) -> ServerConfig:
    """``served_model_name``: the first served model's, the default of requests that name none."""
    jwt = None
    if args.jwt_jwks:
        jwt = JWTConfig(args.jwt_jwks, args.jwt_issuer, args.jwt_audience, args.jwt_tenant_claim, args.jwt_leeway,
                        args.jwt_jwks_refresh)
    tls = None
    if args.ssl_keyfile or args.ssl_certfile:
        if not (args.ssl_keyfile and args.ssl_certfile):
            raise ValueError("HTTPS needs both --ssl-keyfile and --ssl-certfile")
        tls = TLSConfig(args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs, args.ssl_cert_reqs)
    return ServerConfig(
        served_model_name=served_model_name,
        host=args.host,
        port=args.port,
        api_keys=read_api_keys(args, environ),
        jwt=jwt,
        metrics_require_api_key=args.metrics_require_api_key,
        share_prefix_cache_across_tenants=args.share_prefix_cache_across_tenants,
        rate_limit_rpm=args.rate_limit_rpm,
        rate_limit_tpm=args.rate_limit_tpm,
        max_request_bytes=args.max_request_bytes,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        tls_handshake_timeout=args.tls_handshake_timeout,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        tls=tls,
        shutdown_timeout=args.shutdown_timeout,
        tool_call_parser=args.tool_call_parser,
        agent_port=args.agent_port,
    )
