"""``H2Server``: the part of ``grpc.aio.Server`` the broker uses, served on its own event loop.

The generated ``add_*Servicer_to_server`` functions register their handlers here
exactly as on a grpc.aio server, and the servicers run unchanged.  Unlike
grpc.aio, no call crosses a thread: grpc.aio's C core reads the socket on its own
threads and hands each completion to the event loop, and on this 2-core machine
those hand-offs cost more than the call itself (docs/benchmarks.md, "Seventh pass").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Iterable
from typing import Any

from danube.server.h2grpc import wire
from danube.server.h2grpc.connection import GrpcConnection

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_receive_message_length: int = 64 * 1024 * 1024
    max_concurrent_streams: int = 1024
    # Per-stream and connection receive windows: large enough that a client publishing
    # batches of a few MiB is never waiting on WINDOW_UPDATE round trips.
    stream_window: int = 8 * 1024 * 1024
    connection_window: int = 32 * 1024 * 1024
    max_frame_size: int = 1024 * 1024
    max_header_list_size: int = 64 * 1024

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")
        if not 16384 <= self.max_frame_size <= 16777215:
            raise ValueError(f"max_frame_size must be within 16384..16777215 (HTTP/2), got {self.max_frame_size}")
        for name in ("stream_window", "connection_window"):
            if getattr(self, name) > 2**31 - 1:
                raise ValueError(f"{name} must be at most 2^31-1 (HTTP/2), got {getattr(self, name)}")
        if self.connection_window < 65535:
            raise ValueError("connection_window must be at least 65535 (the HTTP/2 initial window)")


class _HandlerCallDetails:
    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, invocation_metadata: tuple) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class H2Server:
    def __init__(self, limits: ServerLimits | None = None) -> None:
        self.limits = limits or ServerLimits()
        self._handlers: dict[str, Any] = {}
        self._generic: list = []
        self._sockets: list[socket.socket] = []
        self._listeners: list[asyncio.AbstractServer] = []
        self._connections: set[GrpcConnection] = set()
        self._terminated: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ registration (grpc.aio's API)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        for name, handler in method_handlers.items():
            self._handlers[f"/{service_name}/{name}"] = handler

    def add_generic_rpc_handlers(self, generic_rpc_handlers: Iterable) -> None:
        self._generic.extend(generic_rpc_handlers)

    def find_handler(self, path: str, headers: list):
        handler = self._handlers.get(path)
        if handler is None and self._generic:
            details = _HandlerCallDetails(path, wire.metadata_from_headers(headers))
            for generic in self._generic:
                handler = generic.service(details)
                if handler is not None:
                    break
        return handler

    def add_insecure_port(self, address: str) -> int:
        """Binds every address ``host:port`` resolves to (port 0: one free port for all); the
        port.  RuntimeError when it cannot bind, as grpc.aio raises."""
        host, _, port_text = address.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        try:
            port = int(port_text)
        except ValueError:
            raise RuntimeError(f"cannot bind {address!r}: the port is not a number") from None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except OSError as exc:
            raise RuntimeError(f"cannot bind {address!r}: {exc}") from exc
        bound: list[socket.socket] = []
        seen = set()
        try:
            for family, kind, proto, _, sockaddr in infos:
                key = (family, sockaddr[0])
                if key in seen:
                    continue
                seen.add(key)
                sock = socket.socket(family, kind, proto)
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    if family == socket.AF_INET6:
                        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                    sock.bind((sockaddr[0], port) + tuple(sockaddr[2:]))
                except OSError:
                    sock.close()
                    raise
                bound.append(sock)
                port = sock.getsockname()[1]
        except OSError as exc:
            for sock in bound:
                sock.close()
            raise RuntimeError(f"cannot bind {address!r}: {exc.strerror or exc}") from exc
        self._sockets.extend(bound)
        return port

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._terminated = asyncio.Event()
        for sock in self._sockets:
            sock.listen(1024)
            self._listeners.append(await self.loop.create_server(
                lambda: GrpcConnection(self), sock=sock, backlog=1024))

    async def stop(self, grace: float | None) -> None:
        """Stop listening, send GOAWAY, let calls in flight finish for ``grace`` seconds, then
        cancel the rest (UNAVAILABLE) and close every connection."""
        for listener in self._listeners:
            listener.close()
        for connection in list(self._connections):
            connection.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0.0)
        while self._busy() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self._busy():
            log.info("grace period over: cancelling the calls of %d connection(s)",
                     sum(1 for c in self._connections if c.busy))
            for connection in list(self._connections):
                connection.cancel_calls()
            for _ in range(3):  # the cancelled handlers answer UNAVAILABLE on their next steps
                await asyncio.sleep(0)
        for connection in list(self._connections):
            connection.close()
        for listener in self._listeners:
            await listener.wait_closed()
        self._listeners.clear()
        if self._terminated is not None:
            self._terminated.set()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        if self._terminated is None:
            return False
        try:
            await asyncio.wait_for(self._terminated.wait(), timeout)
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ from connections

    def connection_opened(self, connection: GrpcConnection) -> None:
        self._connections.add(connection)

    def connection_closed(self, connection: GrpcConnection) -> None:
        self._connections.discard(connection)

    def _busy(self) -> bool:
        return any(c.busy for c in self._connections)
