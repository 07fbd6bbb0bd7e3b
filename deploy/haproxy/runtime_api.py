"""HAProxy's runtime API (the `stats socket` of haproxy.cfg): one command per connection, answered in text."""

import csv
import io
import shlex
import socket
import subprocess
from dataclasses import dataclass


class RuntimeAPIError(RuntimeError):
    """HAProxy refused or did not understand a command."""


@dataclass(frozen=True)
class ServerState:
    """One server of a backend, as `show stat` reports it."""

    backend: str
    name: str
    status: str  # UP, DOWN, DRAIN, MAINT, MAINT (resolution), "DOWN 1/2" while a check is confirming it, ...
    weight: int
    sessions: int  # requests in flight
    total: int  # sessions since HAProxy started

    @property
    def up(self) -> bool:
        return self.status == "UP"


class RuntimeAPI:
    """``address`` is ``host:port`` for a TCP socket, the path of a Unix one, or ``exec:`` and a command that
    carries its standard input to the API and the answer back (compose's API listens on the container's loopback
    only: ``exec:docker compose exec -T haproxy nc 127.0.0.1 9999``)."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        if self.address.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(self.address)
            return sock
        host, _, port = self.address.rpartition(":")
        return socket.create_connection((host, int(port)), self.timeout)

    def ask(self, command: str) -> str:
        """HAProxy's whole answer to ``command``."""
        if self.address.startswith("exec:"):
            return self._ask_through(shlex.split(self.address.removeprefix("exec:")), command)
        with self._connect() as sock:
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def _ask_through(self, carrier: list[str], command: str) -> str:
        try:
            done = subprocess.run(carrier, input=command + "\n", capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise RuntimeAPIError(f"{shlex.join(carrier)}: {error}") from error
        if done.returncode != 0:
            raise RuntimeAPIError(f"{shlex.join(carrier)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def do(self, command: str) -> None:
        """Run a command that answers nothing when it succeeds."""
        answer = self.ask(command).strip()
        if answer:
            raise RuntimeAPIError(f"{command!r}: {answer}")

    def servers(self, backend: str | None = None) -> list[ServerState]:
        text = self.ask("show stat").removeprefix("# ")
        rows = csv.DictReader(io.StringIO(text))
        return [
            ServerState(row["pxname"], row["svname"], row["status"], int(row["weight"] or 0), int(row["scur"] or 0),
                        int(row["stot"] or 0))
            for row in rows
            if row["svname"] not in ("FRONTEND", "BACKEND") and backend in (None, row["pxname"])
        ]  # fmt: skip

    def server(self, backend: str, name: str) -> ServerState:
        found = [state for state in self.servers(backend) if state.name == name]
        if not found:
            raise RuntimeAPIError(f"HAProxy has no server {backend}/{name}")
        return found[0]

    def map_path(self, file_name: str) -> str:
        """The path HAProxy loaded the map file ``file_name`` from (`show map` names maps by path)."""
        for line in self.ask("show map").splitlines():
            # "0 (/usr/local/etc/haproxy/routing.map) pattern loaded from file ..."
            if "(" in line and not line.startswith("#"):
                path = line.split("(", 1)[1].split(")", 1)[0]
                if path.rsplit("/", 1)[-1] == file_name:
                    return path
        raise RuntimeAPIError(f"HAProxy has loaded no map file named {file_name}")
