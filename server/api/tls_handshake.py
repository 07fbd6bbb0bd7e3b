"""TLS done beneath uvicorn's HTTP protocol instead of by uvicorn, for two limits uvicorn cannot set: a deadline
on the handshake (asyncio's default is 60 s, and uvicorn does not pass one), and the connection caps counting a
connection from its TCP accept (the HTTP protocol only hears of it once the handshake is done).

This is what ``loop.create_server(ssl=...)`` builds for each connection, with those two additions."""

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable

from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

from server.api.connection_limits import ConnectionLimits, client_address
from server.config import TLSConfig


def tls_context(tls: TLSConfig) -> ssl.SSLContext:
    """The context uvicorn would have made from the same settings."""
    return create_ssl_context(tls.certfile, tls.keyfile, None, SSL_PROTOCOL_VERSION, tls.cert_reqs, tls.ca_certs,
                              None)


class CountedTLSProtocol(sslproto.SSLProtocol):
    """A connection over the caps is closed before its handshake: no HTTP answer can be read before TLS."""

    def __init__(self, loop: asyncio.AbstractEventLoop, http: asyncio.Protocol, context: ssl.SSLContext,
                 handshake_timeout_s: float, limits: ConnectionLimits) -> None:
        # A close waits for the client's close_notify no longer than a handshake may take.
        super().__init__(loop, http, context, None, server_side=True, ssl_handshake_timeout=handshake_timeout_s,
                         ssl_shutdown_timeout=handshake_timeout_s)
        self._limits = limits
        self._client: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        client = client_address(transport)
        if self._limits.admit(client) is not None:
            transport.abort()
            return
        self._client = client
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._client is None:
            return  # refused: the handshake never began
        self._limits.release(self._client)
        self._client = None
        super().connection_lost(exc)


def tls_protocol_factory(
    http_protocol: Callable[..., asyncio.Protocol], context: ssl.SSLContext, handshake_timeout_s: float,
    limits: ConnectionLimits,
) -> Callable[..., asyncio.Protocol]:
    """What uvicorn's ``http=`` takes: each connection's HTTP protocol, under TLS."""

    def create(**uvicorn_arguments: object) -> asyncio.Protocol:
        loop = uvicorn_arguments.get("_loop") or asyncio.get_running_loop()
        return CountedTLSProtocol(loop, http_protocol(**uvicorn_arguments), context,  # type: ignore[arg-type]
                                  handshake_timeout_s, limits)

    return create
