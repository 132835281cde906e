"""Connections to brokers, topic lookup, and the one retry loop producers and consumers share.

:class:`Connections` is what a producer or consumer needs from its client: a channel per
broker, Danube's ``TopicLookup`` (following ``Redirect``), the retry policy and the health
watches.  :class:`~danube.client.client.DanubeClient` is a ``Connections`` with the builders
on top; this module imports neither the producer nor the consumer, so there is no cycle.

:func:`retrying` is the reconnect loop: it runs an attempt until it returns, and after a
failure asks the caller's ``should_retry`` hook, waits the next backoff delay and tries again,
until the outage's budget (:class:`RetryState`) is used up.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

import grpc

from danube.client.errors import from_rpc_error, is_retriable
from danube.client.h2.channel import H2Channel
from danube.client.h2.lane import TRANSPORTS, GrpcBatchLane, H2BatchLane, default_transport
from danube.client.health import DEFAULT_INTERVAL_S, ClientType, HealthWatch, Target
from danube.client.security import ClientSecurity
from danube.client.topology import TopologyWatch
from danube.errors import ClientError, DanubeError, InvalidArgumentError, NotServedHereError
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube import DanubeApi_pb2_grpc as danube_grpc
from danube.proto.danube_batch import batch_pb2_grpc as batch_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# The owner a broker named in ``x-danube-broker-url`` when it refused a call for a topic it does not
# serve (cluster mode).  Set by :func:`retrying` in the task that retries, consumed by the next
# :meth:`Connections.lookup` of that same attempt loop: the retry goes straight to the owner.
BROKER_URL_HEADER = "x-danube-broker-url"
_redirect_hint: contextvars.ContextVar[str | None] = contextvars.ContextVar("danube_redirect_hint", default=None)


def broker_url_of(exc: grpc.aio.AioRpcError) -> str | None:
    """The owner's URL a refused call carried in its metadata (trailing or initial), if any."""
    for getter in (exc.trailing_metadata, exc.initial_metadata):
        try:
            metadata = getter()
        except Exception:  # noqa: BLE001 - metadata unavailable on this error
            continue
        for key, value in metadata or ():
            if key == BROKER_URL_HEADER and value:
                return value.decode() if isinstance(value, bytes) else str(value)
    return None


# Large batches travel as one gRPC message.
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # Each client its own TCP connection: grpc otherwise shares one per address among every
    # channel of the process, so N clients (``danube bench --connections N``) were one connection,
    # whose stream limit then held every consumer stream beyond it waiting forever.
    ("grpc.use_local_subchannel_pool", 1),
]


def address_of(url: str) -> str:
    """``http://host:port`` (or ``host:port``) → ``host:port`` for a gRPC channel."""
    if "://" not in url:
        return url
    parsed = urlparse(url)
    if not parsed.hostname or not parsed.port:
        raise ValueError(f"service URL {url!r} needs a host and a port")
    return f"{parsed.hostname}:{parsed.port}"


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, bounded in time (and optionally in attempts)."""

    initial_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    give_up_after_s: float = 60.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.give_up_after_s < 0:
            raise ValueError("retry delays must not be negative")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1 (or None for no limit)")

    def delays(self) -> Iterator[float]:
        delay = self.initial_backoff_s
        while True:
            yield delay * (0.5 + random.random() / 2)
            delay = min(delay * 2, self.max_backoff_s)


class RetryState:
    """One outage's budget under a RetryPolicy: ``next_delay()`` is None once it is used up.

    ``reset()`` when the connection is proven healthy again (an ack, a subscription),
    not merely re-established, so a reconnect that keeps failing the same way stays bounded.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        # True while no delay was taken since the last reset: the ack path skips reset() then
        self.fresh = False
        self.reset()

    def reset(self) -> None:
        # called on every ack: nothing to do while no delay was taken since the last reset
        if self.fresh:
            return
        self.fresh = True
        self.attempts = 0
        self._since: float | None = None
        self._delays = self.policy.delays()

    def next_delay(self) -> float | None:
        self.fresh = False
        now = asyncio.get_running_loop().time()
        if self._since is None:
            self._since = now
        policy = self.policy
        if policy.max_attempts is not None and self.attempts >= policy.max_attempts:
            return None
        if now - self._since > policy.give_up_after_s:
            return None
        self.attempts += 1
        return next(self._delays)

    def describe(self) -> str:
        elapsed = 0.0 if self._since is None else asyncio.get_running_loop().time() - self._since
        return f"{self.attempts} attempt(s) over {elapsed:.1f}s"


async def retrying(
    attempt: Callable[[], Awaitable[T]],
    budget: RetryState,
    *,
    what: str,
    should_retry: Callable[[BaseException], bool] = is_retriable,
    give_up: Callable[[DanubeError], DanubeError] | None = None,
) -> T:
    """``await attempt()`` until it returns; the one reconnect loop of the client.

    A failure (an ``AioRpcError``, turned into its ``danube.errors`` type, or a
    ``DanubeError``) is retried after the budget's next delay when ``should_retry(cause)``
    says so; otherwise it is raised.  Once the budget is used up the last error is raised,
    through ``give_up`` when given (which says so and keeps the error as its cause).
    """
    while True:
        cause: BaseException
        try:
            return await attempt()
        except grpc.aio.AioRpcError as exc:
            error, cause = from_rpc_error(exc), exc
            _redirect_hint.set(broker_url_of(exc))
        except DanubeError as exc:
            error, cause = exc, exc
            _redirect_hint.set(None)
        if not should_retry(cause):
            raise error
        delay = budget.next_delay()
        if delay is None:
            raise give_up(error) if give_up is not None else error
        log.info("%s failed (%s); trying again in %.2fs", what, error, delay)
        await asyncio.sleep(delay)


def cancelled_call_error(message: str) -> ClientError:
    """For a CancelledError raised by a gRPC call the client cancelled itself (a health check's
    CLOSE, a drain that timed out): a retriable error.  Cancellation of the task itself goes on."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
    return ClientError(message, retriable=True)


# Consume streams one channel (one HTTP/2 connection) carries at most.  A broker advertises
# SETTINGS_MAX_CONCURRENT_STREAMS (4,096 on ours by default, 100 is common elsewhere) and the transport holds a
# stream past it until another ends: consumer streams never end, so the next consumer on that
# connection would wait forever for its subscription.  Past this many, consumers get a channel of
# their own (opened as needed), leaving the first connection room for producers, lookups and
# health checks.
CONSUME_STREAMS_PER_CHANNEL = 96


class _StreamLane:
    """A channel carrying consumer streams, and how many it carries now."""

    __slots__ = ("channel", "batch_lane", "streams")

    def __init__(self, channel: grpc.aio.Channel | H2Channel, batch_lane) -> None:
        self.channel = channel
        self.batch_lane = batch_lane
        self.streams = 0


class BrokerConnection:
    """One channel to one broker with the stubs the client uses on it (and more channels for
    consumer streams beyond ``CONSUME_STREAMS_PER_CHANNEL``).

    With the ``h2`` transport (the default for plain text, opt-in with TLS or a token) the batch
    lane's Publish and Consume streams go over the client's own HTTP/2 connection
    (``danube.client.h2``), the other calls over grpc.aio; with ``grpc`` everything does."""

    def __init__(self, address: str, security: ClientSecurity | None = None, transport: str | None = None) -> None:
        self.address = address
        self._security = security
        transport = transport or default_transport(security is not None)
        if transport not in TRANSPORTS:
            raise InvalidArgumentError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        self.transport = transport
        self.channel = self._open_channel()
        self.discovery = danube_grpc.DiscoveryStub(self.channel)
        self.health = danube_grpc.HealthCheckStub(self.channel)
        self.batch_health = True  # the batch lane's Health, until the broker answers UNIMPLEMENTED
        # Connections with equal keys reach one broker as one caller: the health checker asks
        # about all their producers and consumers in one call (plain text, or one client's
        # credentials: another client's token may be authorized differently).
        self.broker_key = (address, None if security is None else id(security))
        stub = batch_grpc.BatchLaneStub(self.channel)
        self.batch_lane: H2BatchLane | GrpcBatchLane
        if self.transport == "h2":
            self.stream_channel: grpc.aio.Channel | H2Channel = H2Channel(address, security=security)
            self.batch_lane = H2BatchLane(self.stream_channel, stub)
        else:
            self.stream_channel = self.channel
            self.batch_lane = GrpcBatchLane(self.channel, stub)
        self._lanes = [_StreamLane(self.stream_channel, self.batch_lane)]

    def _open_channel(self) -> grpc.aio.Channel:
        # TLS, mTLS and JWT (danube.client.security), or None for plain text
        if self._security is not None:
            return self._security.channel(self.address, _CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS)

    def open_consume_lane(self) -> _StreamLane:
        """A channel with room for one more consumer stream (its ``batch_lane`` stub); give it
        back with :meth:`close_consume_lane` when the stream ends."""
        for lane in self._lanes:
            if lane.streams < CONSUME_STREAMS_PER_CHANNEL:
                break
        else:
            if self.transport == "h2":
                h2 = H2Channel(self.address, security=self._security)
                lane = _StreamLane(h2, H2BatchLane(h2, batch_grpc.BatchLaneStub(self.channel)))
            else:
                channel = self._open_channel()
                lane = _StreamLane(channel, GrpcBatchLane(channel, batch_grpc.BatchLaneStub(channel)))
            self._lanes.append(lane)
        lane.streams += 1
        return lane

    def close_consume_lane(self, lane: _StreamLane) -> None:
        lane.streams -= 1

    @property
    def channels(self) -> int:
        """Channels (connections) open to this broker for the client's streams."""
        return len(self._lanes)

    async def close(self) -> None:
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            await lane.channel.close()
        if self.stream_channel is not self.channel:
            await self.channel.close()


class Connections:
    """Channels (opened on first use), topic lookup, retries and health watches of one client."""

    def __init__(
        self,
        service_url: str,
        *,
        retry: RetryPolicy | None = None,
        health_check_interval_s: float = DEFAULT_INTERVAL_S,
        security: ClientSecurity | None = None,
        transport: str | None = None,
    ) -> None:
        self.service_url = service_url
        self.security = security
        # "h2" or "grpc" for the Publish and Consume streams (None: DANUBE_CLIENT_TRANSPORT, else h2)
        self.transport = transport
        self.retry = retry or RetryPolicy()
        self.health_check_interval_s = health_check_interval_s
        self._service_address = address_of(service_url)
        self._connections: dict[str, BrokerConnection] = {}
        self._watches: set[HealthWatch] = set()
        self._closed = False
        self._topology: TopologyWatch | None = None

    def connection(self, address: str | None = None) -> BrokerConnection:
        if self._closed:
            raise ClientError("the client is closed")
        address = address or self._service_address
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = BrokerConnection(address, self.security, self.transport)
        return conn

    async def lookup(self, topic: str) -> BrokerConnection:
        """The connection to the broker serving ``topic`` (Danube's TopicLookup); right after a
        broker refused the topic naming its owner in ``x-danube-broker-url``, that owner."""
        hint = _redirect_hint.get()
        if hint:
            _redirect_hint.set(None)
            log.debug("%s: following %s to %s", topic, BROKER_URL_HEADER, hint)
            return self.connection(address_of(hint))
        discovery = self.connection().discovery
        try:
            answer = await discovery.TopicLookup(danube_pb.TopicLookupRequest(request_id=0, topic=topic), timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        kind = answer.response_type
        if kind == danube_pb.TopicLookupResponse.Connect:
            return self.connection()
        if kind == danube_pb.TopicLookupResponse.Redirect:
            # proxy mode: connect_url forwards Danube's calls by header; the batch lane goes to the owner
            url = answer.broker_url if answer.proxy else (answer.connect_url or answer.broker_url)
            return self.connection(address_of(url))
        raise NotServedHereError(f"lookup of {topic} failed: no broker serves it now")

    async def partitions(self, topic: str) -> list[str]:
        """Danube's TopicPartitions: the partition names, or ``[topic]`` for a plain topic."""
        discovery = self.connection().discovery
        try:
            answer = await discovery.TopicPartitions(
                danube_pb.TopicLookupRequest(request_id=0, topic=topic), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return list(answer.partitions) or [topic]

    async def call_with_retry(self, topic: str, action: Callable[[BrokerConnection], Awaitable[T]], *, what: str) -> T:
        """Runs ``action`` on the topic's broker; on a retriable failure looks up again and retries."""

        async def attempt() -> T:
            return await action(await self.lookup(topic))

        return await retrying(attempt, RetryState(self.retry), what=f"{what} on {topic}")

    def topology(self) -> TopologyWatch:
        """The client's live routing: one topology push stream on the service connection."""
        if self._topology is None:
            self._topology = TopologyWatch(self)
        return self._topology

    # ------------------------------------------------------------ health checks

    def watch_health(
        self, client_type: ClientType, target: Target, on_close: Callable[[], None], *, what: str
    ) -> HealthWatch:
        """Starts polling HealthCheck for one producer/consumer; stop with :meth:`unwatch`."""
        watch = HealthWatch(client_type, target, on_close, interval_s=self.health_check_interval_s, what=what)
        watch.start()
        if watch.running:
            self._watches.add(watch)
        return watch

    async def unwatch(self, watch: HealthWatch | None) -> None:
        if watch is not None:
            self._watches.discard(watch)
            await watch.stop()

    def unwatch_nowait(self, watch: HealthWatch | None) -> None:
        """Stops a watch from synchronous code (the task ends at its next await)."""
        if watch is not None:
            self._watches.discard(watch)
            watch.cancel()

    async def close(self) -> None:
        self._closed = True
        topology, self._topology = self._topology, None
        if topology is not None:
            await topology.close()
        watches, self._watches = list(self._watches), set()
        for watch in watches:  # producers/consumers the application did not close
            await watch.stop()
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            await conn.close()
