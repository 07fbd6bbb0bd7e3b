"""How many connections are open, in all and per client address. The HTTP protocol (or, under TLS, the TLS layer
beneath it) asks before serving a new connection, so one client cannot take every slot."""

import asyncio
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


class ConnectionLimits:
    """``max_per_client`` 0 means no cap per address (behind a proxy every client has the proxy's address)."""

    def __init__(self, max_connections: int, max_per_client: int) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.open = 0
        self._per_client: Counter[str] = Counter()

    def admit(self, client: str) -> Refusal | None:
        """Counts the connection in, or says why it is refused (a refused one is not counted)."""
        if self.open >= self.max_connections:
            return Refusal("too_many_connections", f"more than {self.max_connections} connections are open; "
                                                   "retry later")
        if self.max_per_client and self._per_client[client] >= self.max_per_client:
            return Refusal("too_many_connections_from_client", f"this address has {self.max_per_client} "
                                                               "connections open, the most allowed; retry later")
        self.open += 1
        self._per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        self._per_client[client] -= 1
        if not self._per_client[client]:
            del self._per_client[client]


def client_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else ""
