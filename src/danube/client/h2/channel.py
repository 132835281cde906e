"""A target's HTTP/2 connection for the client's streams, opened on first use and again after it ends.

``stream_stream(path, ...)`` gives what a grpc stub's attribute gives: calling it starts a
call (``call.H2StreamCall``).  Calls share one connection while it is usable; once it is lost
or the server sent GOAWAY, the next call opens a new one (grpc.aio's channels reconnect too).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from danube.client.h2 import frames
from danube.client.h2.call import H2StreamCall
from danube.client.h2.connection import H2Connection
from danube.client.h2.limits import H2ClientLimits
from danube.client.h2.status import rpc_error

if TYPE_CHECKING:
    from danube.client.security import ClientSecurity

_USER_AGENT = b"danube-client-h2"


class H2Channel:
    def __init__(
        self, address: str, limits: H2ClientLimits | None = None, security: ClientSecurity | None = None
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"address {address!r} needs a host and a port")
        self.address = address
        self._host = host.strip("[]")
        self._port = int(port)
        self.limits = limits or H2ClientLimits()
        self._conn: H2Connection | None = None
        self._connecting: asyncio.Future | None = None
        self._closed = False
        # TLS (ALPN h2) and the bearer token of each call, as grpc.aio's secure channels
        self._security = security
        self._ssl: ssl.SSLContext | None = security.ssl_context() if security is not None else None

    def stream_stream(
        self, path: str, request_serializer: Callable[[Any], bytes], response_deserializer: Callable[[bytes], Any]
    ) -> Callable[[], H2StreamCall]:
        block = frames.encode_header_block(
            [
                (b":method", b"POST"),
                (b":scheme", b"https" if self._ssl is not None else b"http"),
                (b":path", path.encode()),
                (b":authority", self.address.encode()),
                (b"te", b"trailers"),
                (b"content-type", b"application/grpc"),
                (b"user-agent", _USER_AGENT),
            ]
        )

        security = self._security

        def start() -> H2StreamCall:
            if security is None:
                return H2StreamCall(self, block, request_serializer, response_deserializer)
            return H2StreamCall(self, self._with_token(block), request_serializer, response_deserializer)

        return start

    def _with_token(self, block: bytes) -> bytes:
        assert self._security is not None
        try:
            token = self._security.bearer()
        except Exception as exc:  # noqa: BLE001 - the call fails with the supplier's error
            raise rpc_error(grpc.StatusCode.UNAUTHENTICATED, f"the token supplier failed: {exc!r}") from exc
        if not token:
            return block
        return block + frames.encode_header_block([(b"authorization", b"Bearer " + token.encode())])

    async def connection(self) -> H2Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if self._closed:
            raise rpc_error(grpc.StatusCode.CANCELLED, "Channel closed!")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> H2Connection:
        loop = asyncio.get_running_loop()
        try:
            if self._ssl is None:
                opening = loop.create_connection(
                    lambda: H2Connection(self.address, self.limits), self._host, self._port
                )
            else:
                opening = loop.create_connection(
                    lambda: H2Connection(self.address, self.limits),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host,
                )
            transport, conn = await asyncio.wait_for(opening, self.limits.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.address}: {exc or 'timed out'}")
        finally:
            self._connecting = None
        if self._closed:
            conn.close()
            raise rpc_error(grpc.StatusCode.CANCELLED, "Channel closed!")
        if self._ssl is not None:
            tls = transport.get_extra_info("ssl_object")
            if tls is None or tls.selected_alpn_protocol() != "h2":
                conn.close()
                raise rpc_error(
                    grpc.StatusCode.UNAVAILABLE, f"{self.address} did not agree to HTTP/2 over TLS (ALPN h2)"
                )
        self._conn = conn
        return conn

    async def close(self) -> None:
        """Ends the connection; open calls fail with CANCELLED."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
