"""``DanubeClient``: the entry point and the builders of producers and consumers.

Builder style as in Danube's clients::

    client = DanubeClient.builder().service_url("http://127.0.0.1:6650").build()
    producer = client.new_producer().with_topic("/default/t").with_name("p1").build()
    await producer.create()

A client is a :class:`~danube.client.connection.Connections`: channels opened on first
use, Danube's ``TopicLookup`` (following ``Redirect``), retries with exponential backoff
and the ``HealthCheck`` polling by which producers and consumers follow their topic.
"""

from __future__ import annotations

from collections.abc import Callable

from danube.client.connection import (
    BrokerConnection,
    Connections,
    RetryPolicy,
    RetryState,
    address_of,
)
from danube.client.consumer import ConsumerBuilder
from danube.client.h2.lane import TRANSPORTS
from danube.client.health import DEFAULT_INTERVAL_S
from danube.client.producer import ProducerBuilder
from danube.client.security import (
    ClientSecurity,
    with_mtls,
    with_tls,
    with_token,
    with_token_supplier,
)
from danube.errors import InvalidArgumentError

# Importable from here as before: the connection and retry types live in danube.client.connection.
__all__ = ["BrokerConnection", "DanubeClient", "DanubeClientBuilder", "RetryPolicy", "RetryState", "address_of"]


class DanubeClientBuilder:
    def __init__(self) -> None:
        self._service_url = "http://127.0.0.1:6650"
        self._retry = RetryPolicy()
        self._health_interval_s = DEFAULT_INTERVAL_S
        self._security: ClientSecurity | None = None
        self._transport: str | None = None

    def service_url(self, url: str) -> DanubeClientBuilder:
        address_of(url)  # fail early on a bad URL
        self._service_url = url
        return self

    def with_retry(
        self,
        *,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        give_up_after_s: float = 60.0,
        max_attempts: int | None = None,
    ) -> DanubeClientBuilder:
        try:
            self._retry = RetryPolicy(initial_backoff_s, max_backoff_s, give_up_after_s, max_attempts)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None
        return self

    def with_health_check_interval(self, seconds: float | None) -> DanubeClientBuilder:
        """How often producers and consumers poll HealthCheck (default 5 s; 0 or None: never)."""
        if seconds is not None and seconds < 0:
            raise InvalidArgumentError("the health check interval must not be negative")
        self._health_interval_s = float(seconds or 0.0)
        return self

    def with_transport(self, transport: str) -> DanubeClientBuilder:
        """What carries the producers' Publish and the consumers' Consume streams: ``"h2"`` (the client's own HTTP/2 transport, the default for plain text) or
        ``"grpc"`` (grpc.aio, as every other call; the default with TLS or a token).  Without
        this, ``DANUBE_CLIENT_TRANSPORT`` decides."""
        if transport not in TRANSPORTS:
            raise InvalidArgumentError(f"transport {transport!r}: expected one of {', '.join(TRANSPORTS)}")
        self._transport = transport
        return self

    # Security as in danube-client 0.5.0 (danube.client.security): TLS, mTLS, a JWT or a supplier of one.
    def with_tls(self, ca_cert_path: str) -> DanubeClientBuilder:
        self._security = with_tls(self._security, ca_cert_path)
        return self

    def with_mtls(self, ca_cert_path: str, client_cert_path: str, client_key_path: str) -> DanubeClientBuilder:
        self._security = with_mtls(self._security, ca_cert_path, client_cert_path, client_key_path)
        return self

    def with_token(self, token: str) -> DanubeClientBuilder:
        self._security = with_token(self._security, token)
        return self

    def with_token_supplier(self, supplier: Callable[[], str]) -> DanubeClientBuilder:
        self._security = with_token_supplier(self._security, supplier)
        return self

    def build(self) -> DanubeClient:
        return DanubeClient(
            self._service_url,
            retry=self._retry,
            health_check_interval_s=self._health_interval_s,
            security=self._security,
            transport=self._transport,
        )


class DanubeClient(Connections):
    """Entry point; cheap to build (channels open on first use).  ``async with`` closes it."""

    @staticmethod
    def builder() -> DanubeClientBuilder:
        return DanubeClientBuilder()

    def new_producer(self) -> ProducerBuilder:
        return ProducerBuilder(self)

    def new_consumer(self) -> ConsumerBuilder:
        return ConsumerBuilder(self)

    async def __aenter__(self) -> DanubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
