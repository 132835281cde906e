"""The admin gRPC API as the gateway uses it: one grpc.aio channel, a deadline and a token per call.

TLS as `danube admin` does it (``danube.security.tls.channel_credentials``); the token travels as
``authorization: Bearer`` metadata on each call rather than as channel credentials, so an action can
carry the caller's own token instead of the gateway's (the broker's RBAC then judges the caller).
"""

from __future__ import annotations

from typing import Any

import grpc

from danube.gateway.config import GatewayConfig
from danube.gateway.errors import from_rpc_error
from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.proto.danube_schema import SchemaRegistry_pb2 as spb
from danube.proto.danube_schema import SchemaRegistry_pb2_grpc as spb_grpc

__all__ = ["AdminBackend", "pb", "spb"]

_MAX_MESSAGE = 16 * 1024 * 1024


class AdminBackend:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.channel = self._open_channel(cfg)
        self.brokers = pb_grpc.BrokerAdminStub(self.channel)
        self.topics = pb_grpc.TopicAdminStub(self.channel)
        self.namespaces = pb_grpc.NamespaceAdminStub(self.channel)
        self.schemas = spb_grpc.SchemaRegistryStub(self.channel)

    @staticmethod
    def _open_channel(cfg: GatewayConfig) -> grpc.aio.Channel:
        options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
        target = cfg.grpc_target()
        if not cfg.uses_tls():
            return grpc.aio.insecure_channel(target, options=options)
        from danube.security.tls import channel_credentials

        if cfg.tls_domain:
            options.append(("grpc.ssl_target_name_override", cfg.tls_domain))
        return grpc.aio.secure_channel(
            target, channel_credentials(cfg.tls_ca, cfg.tls_cert, cfg.tls_key), options=options
        )

    async def close(self) -> None:
        await self.channel.close()

    async def call(self, method, request, *, token: str | None = None, timeout: float | None = None):
        """``method(request)`` with the gateway's deadline; ``token`` replaces the gateway's own."""
        token = token or self.cfg.token
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        try:
            return await method(request, timeout=timeout or self.cfg.request_timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # ------------------------------------------------------------ the calls the pages share

    async def list_brokers(self) -> list:
        return list((await self.call(self.brokers.ListBrokers, pb.Empty())).brokers)

    async def leader(self) -> str:
        return (await self.call(self.brokers.GetLeaderBroker, pb.Empty())).leader

    async def namespaces_list(self) -> list[str]:
        return sorted(set((await self.call(self.brokers.ListNamespaces, pb.Empty())).namespaces))

    async def broker_topics(self, broker_id: str) -> list:
        resp = await self.call(self.topics.ListBrokerTopics, pb.BrokerRequest(broker_id=broker_id))
        return sorted(resp.topics, key=lambda t: t.name)

    async def namespace_topics(self, namespace: str) -> list:
        resp = await self.call(self.topics.ListNamespaceTopics, pb.NamespaceRequest(name=namespace))
        return sorted(resp.topics, key=lambda t: t.name)
