"""The fleet dashboard: every replica's load side by side, and what the balancer (HAProxy's own exporter) makes of
it: the weight each replica reports through its agent check, each server's state and requests in flight, the split
between blue and green, and the requests HAProxy retried on another replica."""

from dashboards.panels import (
    API_ROUTES,
    dashboard,
    quantile,
    query_variable,
    rate,
    row,
    series,
    stat,
    target,
    thresholds,
    timeseries,
)

SERVER = "{{proxy}}/{{server}}"
# HAProxy's names for deploy/haproxy/haproxy.cfg's frontend and backends, and its 5xx class of responses.
FRONT_DOOR = 'proxy="vigil"'
GREEN = 'proxy="green"'
BLUE_OR_GREEN = 'proxy=~"blue|green"'
SERVER_ERRORS = 'code="5xx"'


def per_replica(title: str, description: str, expr: str, unit: str = "short", **options: object) -> dict:
    """A line per replica (instance) of ``expr``, which keeps the ``instance`` label."""
    return timeseries(title, description, [target(expr, "{{instance}}")], unit, min_value=0, **options)


def replica_panels() -> list[dict]:
    return [
        row("Replicas side by side"),
        stat(
            "Replicas ready",
            "Replicas whose engine accepts requests (/readyz), among the selected instances.",
            f"sum({series('vigil_engine_ready')})",
            "none",
            thresholds("red", 1, "green"),
            idle="no data",
        ),
        per_replica(
            "Requests running, per replica",
            "Requests in each replica's running batch.",
            f"sum by (instance) ({series('vigil_num_requests_running')})",
            width=10,
        ),
        per_replica(
            "Requests waiting, per replica",
            "Requests in each replica's waiting queue: a queue on one replica while another has none means the "
            "balancer is not spreading the load.",
            f"sum by (instance) ({series('vigil_num_requests_waiting')})",
            width=10,
        ),
        per_replica(
            "KV cache usage, per replica",
            "Share of each replica's KV blocks in use; with the batch and the queue, what its agent check reports.",
            f"max by (instance) ({series('vigil_kv_cache_usage_ratio')})",
            "percentunit",
            width=8,
            max_value=1,
        ),
        per_replica(
            "API requests per second, per replica",
            "Requests each replica answered.",
            f"sum by (instance) ({rate('vigil_http_requests_total', API_ROUTES)})",
            "reqps",
            width=8,
        ),
        per_replica(
            "Time to first token P95, per replica",
            "A replica slower than the others is overloaded, throttled or on other hardware.",
            quantile(0.95, "vigil_time_to_first_token_seconds", by="instance"),
            "s",
            width=8,
        ),
    ]


def balancer_panels() -> list[dict]:
    backend_requests = "haproxy_backend_http_requests_total"
    return [
        row("Balancer (HAProxy's exporter)"),
        timeseries(
            "Weight each replica reports",
            "The weight HAProxy gives each server, set by the replica's agent check: 100 when idle, lower as its "
            "batch, KV cache and queue fill, 0 while it drains.",
            [target(series("haproxy_server_weight"), SERVER)],
            width=8,
            min_value=0,
            stepped=True,
        ),
        timeseries(
            "Requests in flight, per server",
            "Requests HAProxy has sent to each server and not yet seen answered.",
            [target(series("haproxy_server_current_sessions"), SERVER)],
            width=8,
            min_value=0,
        ),
        timeseries(
            "Servers UP",
            "1 while HAProxy sends a server new requests (its /readyz check passes and its agent says up); 0 while "
            "it is down, draining or in maintenance.",
            [target(series("haproxy_server_status", 'state="UP"'), SERVER)],
            "none",
            width=8,
            min_value=0,
            max_value=1,
            stepped=True,
        ),
        timeseries(
            "Requests per second, per server",
            "Responses each server returned through HAProxy.",
            [target(f"sum by (proxy, server) ({rate('haproxy_server_http_responses_total')})", SERVER)],
            "reqps",
            width=8,
            min_value=0,
        ),
        timeseries(
            "Share of new requests to green",
            "Green's share of the requests HAProxy routed (green_percent in deploy/haproxy/routing.map): 0 before a "
            "canary or blue-green switch, 1 after the switch.",
            [
                target(
                    f"sum({rate(backend_requests, GREEN)})\n/ sum({rate(backend_requests, BLUE_OR_GREEN)})",
                    "green",
                )
            ],
            "percentunit",
            width=8,
            min_value=0,
            max_value=1,
        ),
        timeseries(
            "Retried and redispatched requests per minute",
            "Requests a replica refused, dropped or answered 503 (loading, draining), which HAProxy sent again, to "
            "another replica: none of them reached the client as an error.",
            [
                target(f"sum({rate('haproxy_backend_retry_warnings_total')}) * 60", "retried"),
                target(f"sum({rate('haproxy_backend_redispatch_warnings_total')}) * 60", "redispatched"),
            ],
            width=8,
            min_value=0,
        ),
        timeseries(
            "5xx share at the front door",
            "Share of the balancer's answers that are 5xx, whoever produced them: what clients see.",
            [
                target(
                    f"sum({rate('haproxy_frontend_http_responses_total', FRONT_DOOR, SERVER_ERRORS)})\n"
                    f"/ sum({rate('haproxy_frontend_http_requests_total', FRONT_DOOR)})",
                    "5xx",
                )
            ],
            "percentunit",
            width=12,
            min_value=0,
            limits=thresholds("green", 0.05, "red"),
        ),
        timeseries(
            "Requests queued in HAProxy",
            "Requests waiting in HAProxy for a server: above 0 only when no server of the backend can take one.",
            [target(f"sum by (proxy) ({series('haproxy_backend_current_queue')})", "{{proxy}}")],
            width=12,
            min_value=0,
        ),
    ]


def fleet_dashboard() -> dict:
    board = dashboard(
        "vigil-fleet",
        "Fleet",
        "The replicas' load side by side, and the balancer's view of them (docs/fleet.md).",
        [*replica_panels(), *balancer_panels()],
    )
    board["templating"]["list"].append(
        query_variable("balancer", "Balancer", "label_values(haproxy_process_build_info, instance)")
    )
    return board
