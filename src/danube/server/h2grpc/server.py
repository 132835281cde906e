"""``H2Server``: the part of ``grpc.aio.Server`` the broker uses, served on its own event loop.

The generated ``add_*Servicer_to_server`` functions register their handlers here
exactly as on a grpc.aio server, and the servicers run unchanged.  Unlike
grpc.aio, no call crosses a thread: grpc.aio's C core reads the socket on its own
threads and hands each completion to the event loop, and on this 2-core machine
those hand-offs cost more than the call itself (docs/benchmarks.md, "The unary path's cost is
grpc.aio's threads").
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from danube import _allocator
from danube.server.h2grpc import wire
from danube.server.h2grpc.budget import RequestBudget
from danube.server.h2grpc.connection import GrpcConnection
from danube.server.h2grpc.limits import H2Limits, ServerLimits

__all__ = ["H2Limits", "H2Server", "ServerLimits"]

log = logging.getLogger(__name__)

# After a limit trips (a hostile peer), the heap is trimmed once its connection is gone, at
# most this often: what the peer made the server allocate goes back to the system.
_TRIM_EVERY_S = 5.0

# Descriptors kept free for everything else the broker opens (WAL files, the admin port, ...)
# when max_connections is brought down to the process's RLIMIT_NOFILE.
_DESCRIPTORS_KEPT = 256


class _HandlerCallDetails:
    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, invocation_metadata: tuple) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class H2Server:
    def __init__(self, limits: H2Limits | None = None) -> None:
        self.limits = limits or H2Limits()
        self.max_connections = _connection_cap(self.limits.max_connections)
        # Over all connections: open streams, and the request budget (request bytes buffered,
        # connection windows open, the connections waiting for room; budget.py).
        self.open_streams = 0
        self.budget = RequestBudget(self.limits.max_buffered_bytes_total)
        # Response bytes the connections' transports hold for their sockets (as last looked at),
        # and the writers waiting for that total to go down.
        self.send_queued = 0
        self.max_send_queued_total = self.limits.max_send_queued_bytes_total
        self._send_waiters: list[asyncio.Future] = []
        self._per_peer: collections.Counter[str] = collections.Counter()
        self.trips: collections.Counter[str] = collections.Counter()
        self._trip_logged: dict[str, tuple[float, int]] = {}
        self._trim_due = False
        self._trimmed_at = float("-inf")
        self._trim_handle: asyncio.TimerHandle | None = None
        self._handlers: dict[str, Any] = {}
        # Called with (method path, status code) for every call answered (danube.server.rpc_counts).
        self.on_status: Callable[[str, Any], None] | None = None
        self._generic: list = []
        self._sockets: list[socket.socket] = []
        self._listeners: list[asyncio.AbstractServer] = []
        self._connections: set[GrpcConnection] = set()
        # Admitted connections that have not sent their preface yet, oldest first.
        self._unready: dict[GrpcConnection, None] = {}
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

    # TLS (danube.security.tls.server_ssl_context: ALPN h2, client certificates for mTLS);
    # None = HTTP/2 with prior knowledge on a plain socket.
    ssl_context = None

    def add_secure_port(self, address: str, ssl_context) -> int:
        """As ``add_insecure_port``, with TLS on every port of this server (an ``ssl.SSLContext``)."""
        self.ssl_context = ssl_context
        return self.add_insecure_port(address)

    def peer_certificate(self, peer: str):
        """The verified client certificate (``getpeercert()`` dict) of the connection whose
        ``peer`` string a call reports, or None."""
        for connection in self._connections:
            if connection.peer == peer:
                transport = connection._transport
                return transport.get_extra_info("peercert") if transport is not None else None
        return None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._terminated = asyncio.Event()
        for sock in self._sockets:
            sock.listen(1024)
            self._listeners.append(
                await self.loop.create_server(
                    lambda: GrpcConnection(self),
                    sock=sock,
                    backlog=1024,
                    ssl=self.ssl_context,
                    # A TLS handshake gets the HTTP/2 handshake's time limit (the connection is only
                    # counted once the handshake is done).
                    ssl_handshake_timeout=(self.limits.handshake_timeout or None) if self.ssl_context else None,
                )
            )

    async def stop(self, grace: float | None) -> None:
        """Stop listening, send GOAWAY, let calls in flight finish for ``grace`` seconds, then
        cancel the rest (UNAVAILABLE) and close every connection."""
        for listener in self._listeners:
            listener.close()
        if self._trim_handle is not None:
            self._trim_handle.cancel()
            self._trim_handle = None
        for connection in list(self._connections):
            connection.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace or 0.0)
        while self._busy() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self._busy():
            log.info(
                "grace period over: cancelling the calls of %d connection(s)",
                sum(1 for c in self._connections if c.busy),
            )
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
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (gh-86296)
            async with asyncio.timeout(timeout):
                await self._terminated.wait()
        except TimeoutError:
            return False
        return True

    # ------------------------------------------------------------ from connections

    def admit(self, connection: GrpcConnection) -> bool:
        """Registers a new connection; False (and the limit logged) when its peer address already
        has ``max_connections_per_peer``, or there are ``max_connections`` and none can make room.
        At the cap, the oldest connection that has not sent its preface yet makes room, else the
        one idle longest (no call open), so neither silent sockets nor idle connections can lock
        out a client that speaks."""
        address = connection.peer_address
        if self._per_peer[address] >= self.limits.max_connections_per_peer:
            self.trip(
                "max_connections_per_peer",
                connection.peer,
                f"{self._per_peer[address]} connections open from {address}",
            )
            return False
        if len(self._connections) >= self.max_connections:
            victim: GrpcConnection | None
            if self._unready:
                victim = next(iter(self._unready))
                why = "closed before its preface, to make room for a new one"
            else:
                victim = self._longest_idle()
                if victim is None:
                    self.trip("max_connections", connection.peer, f"{len(self._connections)} connections open")
                    return False
                why = f"idle for {cast(asyncio.AbstractEventLoop, self.loop).time() - victim.idle_since:.1f} s: closed to make room for a new one"
            self.trip("max_connections", victim.peer, why)
            self._release(victim)
            victim.evict()
        self._connections.add(connection)
        self._per_peer[address] += 1
        self._unready[connection] = None
        return True

    def _longest_idle(self) -> GrpcConnection | None:
        """The connection with no call open that has been so the longest (a scan: only at the cap)."""
        best = None
        for candidate in self._connections:
            if not candidate.busy and (best is None or candidate.idle_since < best.idle_since):
                best = candidate
        return best

    def _release(self, connection: GrpcConnection) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            address = connection.peer_address
            self._per_peer[address] -= 1
            if self._per_peer[address] <= 0:
                del self._per_peer[address]
        self._unready.pop(connection, None)

    def ready(self, connection: GrpcConnection) -> None:
        """``connection`` sent its preface and SETTINGS: it no longer makes room for new ones."""
        self._unready.pop(connection, None)

    def connection_closed(self, connection: GrpcConnection) -> None:
        self._release(connection)
        budget = self.budget
        budget.forget(connection)
        self.wake_senders()
        if budget.window_starved:
            budget.feed_windows()
        if self._trim_due and self._trim_handle is None and self.loop is not None:
            wait = max(0.5, self._trimmed_at + _TRIM_EVERY_S - time.monotonic())
            self._trim_handle = self.loop.call_later(wait, self._trim)

    def _trim(self) -> None:
        """The heap trimmed in a worker thread (it takes the malloc locks, not the event loop)."""
        self._trim_handle = None
        self._trim_due = False
        self._trimmed_at = time.monotonic()
        if self.loop is not None and not self.loop.is_closed():
            self.loop.run_in_executor(None, _allocator.trim)
        if self.budget.starved and not self.budget.over:
            self.budget.feed_starved()

    @property
    def connections(self) -> int:
        return len(self._connections)

    # What tests and metrics read of the request budget.
    @property
    def buffered_total(self) -> int:
        return self.budget.held

    @property
    def recv_windows(self) -> int:
        return self.budget.windows

    @property
    def starved(self) -> set[GrpcConnection]:
        return self.budget.starved

    # ------------------------------------------------------------ the send-side bound

    def refresh_send_queued(self) -> None:
        """Looks at every transport again: a backlog that drained without the transport saying so
        (it was under its high-water mark) leaves the total.  Only when the total is over its bound."""
        for connection in self._connections:
            connection.refresh_backlog()

    async def wait_send_room(self, recheck: float) -> None:
        """Until some connection's backlog drained (or ``recheck`` seconds, to look again)."""
        loop = cast(asyncio.AbstractEventLoop, self.loop)  # connections write only while the server listens
        waiter = loop.create_future()
        self._send_waiters.append(waiter)
        handle = loop.call_later(recheck, _wake, waiter)
        try:
            await waiter
        finally:
            handle.cancel()

    def wake_senders(self) -> None:
        if self._send_waiters:
            waiters, self._send_waiters = self._send_waiters, []
            for waiter in waiters:
                _wake(waiter)

    def trip(self, limit: str, peer: str, detail: str) -> None:
        """A peer ran into ``limit``: counted, and logged -- at most one line per limit a second
        (with how many were not logged), so a flood of trips cannot flood the log."""
        self.trips[limit] += 1
        self._trim_due = True
        now = time.monotonic()
        last, quiet = self._trip_logged.get(limit, (0.0, 0))
        if now - last < 1.0:
            self._trip_logged[limit] = (last, quiet + 1)
            return
        self._trip_logged[limit] = (now, 0)
        log.warning(
            "h2 limit %s tripped by %s: %s%s",
            limit,
            peer,
            detail,
            f" ({quiet} more in the last second not logged)" if quiet else "",
        )

    def _busy(self) -> bool:
        return any(c.busy for c in self._connections)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _connection_cap(configured: int) -> int:
    """``max_connections``, brought down to what RLIMIT_NOFILE leaves (logged when it is)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or configured <= soft - _DESCRIPTORS_KEPT:
        return configured
    cap = max(1, soft - _DESCRIPTORS_KEPT)
    log.warning(
        "max_connections %d is over what the descriptor limit (RLIMIT_NOFILE %d) leaves: %d", configured, soft, cap
    )
    return cap
