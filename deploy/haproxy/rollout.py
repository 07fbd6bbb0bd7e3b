"""Zero-downtime changes to the fleet behind HAProxy, through its runtime API (docs/fleet.md). From the repository:

    python -m deploy.haproxy.rollout status
    python -m deploy.haproxy.rollout restart blue \\
        --replace 'docker compose up -d --no-deps --force-recreate --wait {server}'
    python -m deploy.haproxy.rollout shift 100     # blue-green: every new request to green (10: a canary)

`restart` replaces a backend's servers one at a time: HAProxy drains the server (its agent check paused, so the
replica cannot lift the drain), its requests in flight finish, --replace runs (and must return once the new
replica is ready), the agent check resumes (its `up ready` ends the drain) and the next server waits until HAProxy
sends this one requests again. `shift` moves new requests between backends blue and green, then waits until the
side it emptied has finished its requests in flight.
"""

import argparse
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from deploy.haproxy.runtime_api import RuntimeAPI, RuntimeAPIError

# Names shared with haproxy.cfg (tests/test_haproxy_config.py keeps them in step).
BACKENDS = ("blue", "green")
# compose's HAProxy serves its runtime API on its own loopback only; busybox's nc in its image carries a command.
COMPOSE_RUNTIME_API = "exec:docker compose exec -T haproxy nc 127.0.0.1 9999"
ROUTING_MAP = "routing.map"
GREEN_PERCENT_KEY = "green_percent"
POLL_INTERVAL_S = 0.5


class RolloutError(RuntimeError):
    pass


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every half second, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise RolloutError(f"not within {timeout:g}s: {what}")
        time.sleep(POLL_INTERVAL_S)


def restart(
    api: RuntimeAPI,
    backend: str,
    replace: Callable[[str], None],
    drain_timeout: float,
    ready_timeout: float,
    log: Callable[[str], None] = print,
) -> None:
    """Replace every server of ``backend`` that has an address (a replica that is not run is in MAINT)."""
    for name in [state.name for state in api.servers(backend) if not state.status.startswith("MAINT")]:
        replace_one(api, backend, name, replace, drain_timeout, ready_timeout, log)


def replace_one(
    api: RuntimeAPI,
    backend: str,
    name: str,
    replace: Callable[[str], None],
    drain_timeout: float,
    ready_timeout: float,
    log: Callable[[str], None],
) -> None:
    server = f"{backend}/{name}"
    if not [state for state in api.servers(backend) if state.name != name and state.up]:
        raise RolloutError(f"{server}: no other server of {backend} is UP to take its requests")
    log(f"{server}: draining")
    api.do(f"disable agent {server}")
    try:
        api.do(f"set server {server} state drain")
        wait_until(lambda: api.server(backend, name).sessions == 0, drain_timeout,
                   f"{server} finishes its requests in flight")  # fmt: skip
        log(f"{server}: drained; replacing")
        replace(name)
    finally:
        api.do(f"enable agent {server}")
    wait_until(lambda: api.server(backend, name).up, ready_timeout, f"{server} is UP again")
    log(f"{server}: UP, weight {api.server(backend, name).weight}")


def shift(api: RuntimeAPI, green_percent: int, drain_timeout: float, log: Callable[[str], None] = print) -> None:
    """Send ``green_percent`` of new requests to green, the rest to blue."""
    if not 0 <= green_percent <= 100:
        raise RolloutError("the green share is a percentage, 0 to 100")
    shares = {"blue": 100 - green_percent, "green": green_percent}
    for backend, share in shares.items():
        if share and not [state for state in api.servers(backend) if state.up]:
            raise RolloutError(f"{backend} would get {share}% of new requests but has no server UP")
    api.do(f"set map {api.map_path(ROUTING_MAP)} {GREEN_PERCENT_KEY} {green_percent}")
    log(f"new requests: {shares['blue']}% blue, {shares['green']}% green (keep it across HAProxy restarts: "
        f"{GREEN_PERCENT_KEY} {green_percent} in deploy/haproxy/{ROUTING_MAP})")  # fmt: skip
    emptied = next((backend for backend, share in shares.items() if share == 0), None)
    if emptied is not None:
        wait_until(lambda: sum(state.sessions for state in api.servers(emptied)) == 0, drain_timeout,
                   f"{emptied} finishes its requests in flight")  # fmt: skip
        log(f"{emptied}: no request left in flight")


def status(api: RuntimeAPI, log: Callable[[str], None] = print) -> None:
    for state in api.servers():
        log(f"{state.backend}/{state.name}: {state.status}, weight {state.weight}, {state.sessions} in flight")


def shell_replace(template: str) -> Callable[[str], None]:
    """Runs ``template`` with ``{server}`` filled in; a failure stops the rollout."""

    def replace(server: str) -> None:
        command = template.format(server=shlex.quote(server))
        if subprocess.run(command, shell=True).returncode != 0:
            raise RolloutError(f"the replace command failed: {command}")

    return replace


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.haproxy.rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--api", default=COMPOSE_RUNTIME_API,
                        help="HAProxy's runtime API: host:port, a socket path, or exec: and a command that carries "
                             "stdin to it (default: compose's, on the haproxy container's loopback)")
    parser.add_argument("--drain-timeout", type=float, default=600.0,
                        help="seconds to wait for requests in flight (above the longest generation you allow)")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status", help="every server's state, weight and requests in flight")
    restart_parser = commands.add_parser("restart", help="replace a backend's servers one at a time")
    restart_parser.add_argument("backend", choices=BACKENDS)
    restart_parser.add_argument("--replace", required=True,
                                help="shell command that replaces {server} and returns once it is ready")
    restart_parser.add_argument("--ready-timeout", type=float, default=600.0,
                                help="seconds a replaced server gets to be UP in HAProxy again")
    shift_parser = commands.add_parser("shift", help="move new requests between blue and green")
    shift_parser.add_argument("green_percent", type=int, help="0: all blue; 100: all green; between: a canary")
    args = parser.parse_args(argv)

    api = RuntimeAPI(args.api)
    try:
        if args.command == "status":
            status(api)
        elif args.command == "restart":
            restart(api, args.backend, shell_replace(args.replace), args.drain_timeout, args.ready_timeout)
        else:
            shift(api, args.green_percent, args.drain_timeout)
    except (RolloutError, RuntimeAPIError, OSError) as error:
        print(f"rollout: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
