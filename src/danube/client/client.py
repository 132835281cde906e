"""``DanubeClient``: connections, topic lookup and the builders of producers and consumers.

Builder style as in Danube's clients::

    client = DanubeClient.builder().service_url("http://127.0.0.1:6650").build()
    producer = client.new_producer().with_topic("/default/t").with_name("p1").build()
    await producer.create()

Topics are looked up with Danube's ``Discovery.TopicLookup``; a ``Redirect``
answer sends the producer or consumer to the named broker.  Every retriable
failure (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``RESOURCE_EXHAUSTED``) is
retried with exponential backoff after looking the topic up again.  Producers
and consumers also poll Danube's ``HealthCheck`` (``health_check_interval_s``,
5 s by default) and follow their topic when the broker answers ``CLOSE``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar
from urllib.parse import urlparse

import grpc

from danube.client.errors import from_rpc_error, is_retriable
from danube.client.health import DEFAULT_INTERVAL_S, HealthWatch
from danube.errors import ClientError, DanubeError, InvalidArgumentError, NotServedHereError
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube import DanubeApi_pb2_grpc as danube_grpc
from danube.proto.danube_batch import batch_pb2_grpc as batch_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# Large batches travel as one gRPC message.
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
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

    def delays(self):
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
        self.reset()

    def reset(self) -> None:
        self.attempts = 0
        self._since: float | None = None
        self._delays = self.policy.delays()

    def next_delay(self) -> float | None:
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


class BrokerConnection:
    """One channel to one broker with the stubs the client uses on it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self.discovery = danube_grpc.DiscoveryStub(self.channel)
        self.batch_lane = batch_grpc.BatchLaneStub(self.channel)
        self.health = danube_grpc.HealthCheckStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()


class DanubeClientBuilder:
    def __init__(self) -> None:
        self._service_url = "http://127.0.0.1:6650"
        self._retry = RetryPolicy()
        self._health_interval_s = DEFAULT_INTERVAL_S

    def service_url(self, url: str) -> "DanubeClientBuilder":
        address_of(url)  # fail early on a bad URL
        self._service_url = url
        return self

    def with_retry(self, *, initial_backoff_s: float = 0.05, max_backoff_s: float = 2.0,
                   give_up_after_s: float = 60.0, max_attempts: int | None = None) -> "DanubeClientBuilder":
        try:
            self._retry = RetryPolicy(initial_backoff_s, max_backoff_s, give_up_after_s, max_attempts)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return self

    def with_health_check_interval(self, seconds: float | None) -> "DanubeClientBuilder":
        """How often producers and consumers poll HealthCheck (default 5 s; 0 or None: never)."""
        if seconds is not None and seconds < 0:
            raise InvalidArgumentError("the health check interval must not be negative")
        self._health_interval_s = float(seconds or 0.0)
        return self

    def build(self) -> "DanubeClient":
        return DanubeClient(self._service_url, retry=self._retry, health_check_interval_s=self._health_interval_s)


class DanubeClient:
    """Entry point; cheap to build (channels open on first use).  ``async with`` closes it."""

    def __init__(self, service_url: str, *, retry: RetryPolicy | None = None,
                 health_check_interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.service_url = service_url
        self.retry = retry or RetryPolicy()
        self.health_check_interval_s = health_check_interval_s
        self._service_address = address_of(service_url)
        self._connections: dict[str, BrokerConnection] = {}
        self._watches: set[HealthWatch] = set()
        self._closed = False

    @staticmethod
    def builder() -> DanubeClientBuilder:
        return DanubeClientBuilder()

    def new_producer(self):
        from danube.client.producer import ProducerBuilder

        return ProducerBuilder(self)

    def new_consumer(self):
        from danube.client.consumer import ConsumerBuilder

        return ConsumerBuilder(self)

    # ------------------------------------------------------------ connections

    def connection(self, address: str | None = None) -> BrokerConnection:
        if self._closed:
            raise ClientError("the client is closed")
        address = address or self._service_address
        conn = self._connections.get(address)
        if conn is None:
            conn = self._connections[address] = BrokerConnection(address)
        return conn

    async def lookup(self, topic: str) -> BrokerConnection:
        """The connection to the broker serving ``topic`` (Danube's TopicLookup)."""
        discovery = self.connection().discovery
        try:
            answer = await discovery.TopicLookup(danube_pb.TopicLookupRequest(request_id=0, topic=topic),
                                                 timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        kind = answer.response_type
        if kind == danube_pb.TopicLookupResponse.Connect:
            return self.connection()
        if kind == danube_pb.TopicLookupResponse.Redirect:
            url = answer.connect_url or answer.broker_url
            return self.connection(address_of(url))
        raise NotServedHereError(f"lookup of {topic} failed: no broker serves it now")

    async def partitions(self, topic: str) -> list[str]:
        """Danube's TopicPartitions: the partition names, or ``[topic]`` for a plain topic."""
        discovery = self.connection().discovery
        try:
            answer = await discovery.TopicPartitions(danube_pb.TopicLookupRequest(request_id=0, topic=topic),
                                                     timeout=10)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None
        return list(answer.partitions) or [topic]

    async def call_with_retry(self, topic: str, action: Callable[[BrokerConnection], Awaitable[T]],
                              *, what: str) -> T:
        """Runs ``action`` on the topic's broker; on a retriable failure looks up again and retries."""
        budget = RetryState(self.retry)
        while True:
            try:
                conn = await self.lookup(topic)
                return await action(conn)
            except grpc.aio.AioRpcError as exc:
                error: DanubeError = from_rpc_error(exc)
                cause = exc
            except DanubeError as exc:
                error, cause = exc, exc
            if not is_retriable(cause):
                raise error
            delay = budget.next_delay()
            if delay is None:
                raise error
            log.info("%s on %s failed (%s); retrying in %.2fs", what, topic, error, delay)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------ health checks

    def watch_health(self, client_type: int, target, on_close, *, what: str) -> HealthWatch:
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
        watches, self._watches = list(self._watches), set()
        for watch in watches:   # producers/consumers the application did not close
            await watch.stop()
        connections, self._connections = list(self._connections.values()), {}
        for conn in connections:
            await conn.close()

    async def __aenter__(self) -> "DanubeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
