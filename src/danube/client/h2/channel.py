"""A target's HTTP/2 connection for the client's streams, opened on first use and again after it ends.

``stream_stream(path, ...)`` gives what a grpc stub's attribute gives: calling it starts a
call (``call.H2StreamCall``).  Calls share one connection while it is usable; once it is lost
or the server sent GOAWAY, the next call opens a new one (grpc.aio's channels reconnect too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from danube.client.h2 import frames
from danube.client.h2.call import H2StreamCall
from danube.client.h2.connection import H2Connection
from danube.client.h2.limits import H2ClientLimits
from danube.client.h2.status import rpc_error

_USER_AGENT = b"danube-client-h2"


class H2Channel:
    def __init__(self, address: str, limits: H2ClientLimits | None = None) -> None:
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

    def stream_stream(
        self, path: str, request_serializer: Callable[[Any], bytes], response_deserializer: Callable[[bytes], Any]
    ) -> Callable[[], H2StreamCall]:
        block = frames.literal_block(
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", path.encode()),
                (b":authority", self.address.encode()),
                (b"te", b"trailers"),
                (b"content-type", b"application/grpc"),
                (b"user-agent", _USER_AGENT),
            ]
        )

        def start() -> H2StreamCall:
            return H2StreamCall(self, block, request_serializer, response_deserializer)

        return start

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
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: H2Connection(self.address, self.limits), self._host, self._port),
                self.limits.connect_timeout_s,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise rpc_error(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.address}: {exc or 'timed out'}")
        finally:
            self._connecting = None
        if self._closed:
            conn.close()
            raise rpc_error(grpc.StatusCode.CANCELLED, "Channel closed!")
        self._conn = conn
        return conn

    async def close(self) -> None:
        """Ends the connection; open calls fail with CANCELLED."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
