"""Danube's ``BrokerAdmin`` and ``NamespaceAdmin`` services: brokers (list, leader, drain, activate,
rebalancing) and namespaces (list, policies, create, delete).

Drain and rebalancing answer UNIMPLEMENTED on a standalone broker.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import grpc

from danube.cluster import peers
from danube.errors import AlreadyExistsError, DanubeError, NotFoundError
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.server.admin_context import AdminContext, forwarded, namespace_name, unimplemented
from danube.server.status import abort

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class BrokerAdmin(pb_grpc.BrokerAdminServicer):
    def __init__(self, admin: AdminContext) -> None:
        self.admin = admin

    async def ListBrokers(self, request, context):
        b = self.admin.broker
        cluster = getattr(b, "cluster", None)
        if cluster is not None:  # cluster mode: every registered broker, from this broker's view
            view = cluster.view
            return pb.BrokerListResponse(
                brokers=[
                    pb.BrokerInfo(
                        broker_id=broker_id,
                        broker_addr=str(info.get("broker_url") or ""),
                        admin_addr=str(info.get("admin_url") or ""),
                        metrics_addr=str(info.get("metrics_url") or ""),
                        broker_role="Cluster_Leader" if broker_id == view.leader else "Cluster_Follower",
                        broker_status=view.broker_states.get(broker_id, "active"),
                    )
                    for broker_id, info in sorted(view.registered.items())
                ]
            )
        return pb.BrokerListResponse(
            brokers=[
                pb.BrokerInfo(
                    broker_id=str(b.broker_id),
                    broker_addr=b.broker_url,
                    broker_role="Cluster_Leader",
                    metrics_addr=b.metrics_url or "",
                    broker_status="active",
                )
            ]
        )

    async def GetLeaderBroker(self, request, context):
        cluster = self.admin.broker.cluster
        if cluster is not None:
            return pb.BrokerResponse(leader=str(cluster.view.leader or ""))
        return pb.BrokerResponse(leader=str(self.admin.broker.broker_id))

    async def ListNamespaces(self, request, context):
        async def build():
            return pb.NamespaceListResponse(namespaces=await self.admin.namespaces())

        try:
            return await self.admin.listings.get("namespaces", build)
        except DanubeError as exc:
            await abort(context, exc)

    async def UnloadBroker(self, request, context):
        cluster = self.admin.broker.cluster
        if cluster is None:
            await unimplemented(context, "UnloadBroker")
        assert cluster is not None  # unimplemented aborted the call without one
        try:
            result = await cluster.drain(
                request.broker_id or cluster.broker_id,
                dry_run=request.dry_run,
                caller=peers.caller_authorization(context),
                include=tuple(request.namespaces_include),
                exclude=tuple(request.namespaces_exclude),
                timeout_s=float(request.timeout_seconds or 60),
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.UnloadBrokerResponse(started=not request.dry_run, **result)

    async def ActivateBroker(self, request, context):
        cluster = self.admin.broker.cluster
        if cluster is None:
            await unimplemented(context, "ActivateBroker")
        assert cluster is not None  # unimplemented aborted the call without one
        try:
            await cluster.activate(request.broker_id)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ActivateBrokerResponse(success=True)

    # ------------------------------------------------------------ rebalancing (docs/rebalancing.md)
    # answered with the broker's Rebalancer, which the cluster layer sets as ``broker.rebalancer``

    async def _rebalancing(self, context, what: str, call):
        from danube.cluster.rebalancing import admin as rebalancing_admin

        rebalancer = self.admin.broker.rebalancer
        if rebalancer is None:
            await unimplemented(context, what)
        try:
            return await call(rebalancing_admin, rebalancer)
        except rebalancing_admin.NotLeaderError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except DanubeError as exc:
            await abort(context, exc)

    async def GetClusterBalance(self, request, context):
        return await self._rebalancing(context, "GetClusterBalance", lambda m, r: m.cluster_balance(r))

    async def TriggerRebalance(self, request, context):
        cluster = self.admin.cluster
        if (
            cluster is not None
            and not forwarded(context)
            and cluster.view.leader
            and str(cluster.view.leader) != str(cluster.broker_id)
        ):  # only the leader moves topics
            return await self.admin.forward(
                str(cluster.view.leader), "TriggerRebalance", request, context, stub=pb_grpc.BrokerAdminStub
            )
        max_moves = request.max_moves if request.HasField("max_moves") else None
        return await self._rebalancing(
            context, "TriggerRebalance", lambda m, r: m.rebalance(r, dry_run=request.dry_run, max_moves=max_moves)
        )

    async def GetRebalancingHistory(self, request, context):
        limit = request.limit if request.HasField("limit") else None
        return await self._rebalancing(context, "GetRebalancingHistory", lambda m, r: m.history(r, limit=limit))


class NamespaceAdmin(pb_grpc.NamespaceAdminServicer):
    def __init__(self, admin: AdminContext) -> None:
        self.admin = admin

    async def GetNamespaceTopics(self, request, context):
        async def build():
            return pb.TopicListResponse(topics=list(await self.admin.topics_in(request.name)))

        try:
            return await self.admin.listings.get(("names", request.name), build)
        except DanubeError as exc:
            await abort(context, exc)

    async def GetNamespacePolicies(self, request, context):
        try:
            doc = await self.admin.metadata.get_json(keys.namespace_policy(namespace_name(request.name)))
            return pb.PolicyResponse(policies=json.dumps(doc or {}))
        except DanubeError as exc:
            await abort(context, exc)

    async def CreateNamespace(self, request, context):
        """A namespace is its policy key in the shared metadata store (any broker, same answer)."""
        try:
            ns = namespace_name(request.name)
            if ns in await self.admin.namespaces():
                raise AlreadyExistsError(f"namespace {ns} already exists")
            await self.admin.metadata.put_json(keys.namespace_policy(ns), {})
            return pb.NamespaceResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def DeleteNamespace(self, request, context):
        """Only an empty namespace (no topic in metadata or the cluster's assignments) is deleted."""
        try:
            ns = namespace_name(request.name)
            if ns not in await self.admin.namespaces():
                raise NotFoundError(f"namespace {ns} does not exist")
            topics = await self.admin.topics_in(ns)
            if topics:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"namespace {ns} still has {len(topics)} topic(s); delete them first",
                )
            await self.admin.metadata.delete_prefix(keys.namespace(ns) + "/")
            await self.admin.metadata.delete(keys.namespace(ns))
            return pb.NamespaceResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)
