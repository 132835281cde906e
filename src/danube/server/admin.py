"""Danube's admin gRPC service (package ``danube_admin``) for one broker.

``add_to_server(server, broker)`` registers BrokerAdmin, NamespaceAdmin and
TopicAdmin on a ``grpc.aio`` server (the admin port, 50051 by default).
Topic and namespace listings read the metadata store (every topic the cluster
knows) and the broker (topics served here).  RPCs that need the cluster layer
answer UNIMPLEMENTED with a sentence saying so.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import grpc

from danube.errors import DanubeError, NotFoundError, quote
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.server.status import abort

log = logging.getLogger(__name__)


def namespace_name(namespace: str) -> str:
    """A namespace as Danube's admin CLI sends it (``default`` or ``/default``), checked by the
    project's name rule."""
    ns = namespace[1:] if isinstance(namespace, str) and namespace.startswith("/") else namespace
    return keys.check_namespace(ns)


def _delivery(doc: Any) -> str:
    strategy = (doc or {}).get("dispatch_strategy", "") if isinstance(doc, dict) else ""
    return "Reliable" if str(strategy).lower() == "reliable" else "NonReliable"


class _Admin:
    """Shared lookups over the broker and its metadata store."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.metadata = broker.metadata

    async def topics_in(self, namespace: str) -> dict[str, str]:
        """``{topic: delivery}`` for every topic of ``namespace`` known to metadata or served here."""
        ns = namespace_name(namespace)
        out: dict[str, str] = {}
        for kv in await self.metadata.get_prefix(f"/topics/{ns}/"):
            parts = kv.key.split("/")  # ['', 'topics', ns, topic, field, ...]
            if len(parts) >= 5:
                name = f"/{ns}/{parts[3]}"
                if parts[4] == "delivery":
                    out[name] = _delivery(json.loads(kv.value))
                else:
                    out.setdefault(name, "")
        for name, topic in self.broker.topics.items():
            if keys.split_topic(name)[0] == ns:
                out[name] = "Reliable" if topic.reliable else "NonReliable"
        return {name: delivery or "NonReliable" for name, delivery in sorted(out.items())}

    async def namespaces(self) -> list[str]:
        names = set()
        for kv in await self.metadata.get_prefix("/namespaces/"):
            parts = kv.key.split("/")
            if len(parts) >= 3 and parts[2]:
                names.add(parts[2])
        for kv in await self.metadata.get_prefix("/topics/"):
            parts = kv.key.split("/")
            if len(parts) >= 3 and parts[2]:
                names.add(parts[2])
        for name in self.broker.topics:
            names.add(keys.split_topic(name)[0])
        return sorted(names)

    async def subscriptions(self, topic: str) -> list[str]:
        keys.split_topic(topic)
        names = set()
        prefix = keys.topic_subscriptions(topic)
        for kv in await self.metadata.get_prefix(prefix):
            sub = kv.key[len(prefix):].split("/", 1)[0]
            if sub:
                names.add(sub)
        served = self.broker.topics.get(topic)
        if served is not None:
            names.update(served.subscriptions.keys())
        return sorted(names)

    async def known(self, topic: str) -> tuple[bool, str]:
        """(exists, delivery) of a topic."""
        keys.split_topic(topic)
        served = self.broker.topics.get(topic)
        if served is not None:
            return True, "Reliable" if served.reliable else "NonReliable"
        doc = await self.metadata.get_json(keys.topic_delivery(topic))
        return doc is not None, _delivery(doc)


async def _unimplemented(context, what: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                        f"{what} is not available on a standalone broker yet (it comes with the cluster layer)")


class BrokerAdmin(pb_grpc.BrokerAdminServicer):
    def __init__(self, admin: _Admin) -> None:
        self.admin = admin

    async def ListBrokers(self, request, context):
        b = self.admin.broker
        cluster = getattr(b, "cluster", None)
        if cluster is not None:  # cluster mode: every registered broker, from this broker's view
            view = cluster.view
            return pb.BrokerListResponse(brokers=[pb.BrokerInfo(
                broker_id=broker_id, broker_addr=str(info.get("broker_url") or ""),
                admin_addr=str(info.get("admin_url") or ""),
                broker_role="Cluster_Leader" if broker_id == view.leader else "Cluster_Follower",
                broker_status=view.broker_states.get(broker_id, "active"))
                for broker_id, info in sorted(view.registered.items())])
        return pb.BrokerListResponse(brokers=[pb.BrokerInfo(
            broker_id=str(b.broker_id), broker_addr=b.broker_url, broker_role="Cluster_Leader",
            broker_status="active")])

    async def GetLeaderBroker(self, request, context):
        cluster = getattr(self.admin.broker, "cluster", None)
        if cluster is not None:
            return pb.BrokerResponse(leader=str(cluster.view.leader or ""))
        return pb.BrokerResponse(leader=str(self.admin.broker.broker_id))

    async def ListNamespaces(self, request, context):
        try:
            return pb.NamespaceListResponse(namespaces=await self.admin.namespaces())
        except DanubeError as exc:
            await abort(context, exc)

    async def UnloadBroker(self, request, context):
        cluster = getattr(self.admin.broker, "cluster", None)
        if cluster is None:
            await _unimplemented(context, "UnloadBroker")
        try:
            result = await cluster.drain(request.broker_id or cluster.broker_id, dry_run=request.dry_run,
                                         include=tuple(request.namespaces_include),
                                         exclude=tuple(request.namespaces_exclude),
                                         timeout_s=float(request.timeout_seconds or 60))
        except DanubeError as exc:
            await abort(context, exc)
        return pb.UnloadBrokerResponse(started=not request.dry_run, **result)

    async def ActivateBroker(self, request, context):
        cluster = getattr(self.admin.broker, "cluster", None)
        if cluster is None:
            await _unimplemented(context, "ActivateBroker")
        try:
            await cluster.activate(request.broker_id)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ActivateBrokerResponse(success=True)

    # ------------------------------------------------------------ rebalancing (docs/rebalancing.md)
    # answered with the broker's Rebalancer, which the cluster layer sets as ``broker.rebalancer``

    async def _rebalancing(self, context, what: str, call):
        from danube.cluster.rebalancing import admin as rebalancing_admin

        rebalancer = getattr(self.admin.broker, "rebalancer", None)
        if rebalancer is None:
            await _unimplemented(context, what)
        try:
            return await call(rebalancing_admin, rebalancer)
        except rebalancing_admin.NotLeaderError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except DanubeError as exc:
            await abort(context, exc)

    async def GetClusterBalance(self, request, context):
        return await self._rebalancing(context, "GetClusterBalance", lambda m, r: m.cluster_balance(r))

    async def TriggerRebalance(self, request, context):
        max_moves = request.max_moves if request.HasField("max_moves") else None
        return await self._rebalancing(context, "TriggerRebalance", lambda m, r: m.rebalance(
            r, dry_run=request.dry_run, max_moves=max_moves))

    async def GetRebalancingHistory(self, request, context):
        limit = request.limit if request.HasField("limit") else None
        return await self._rebalancing(context, "GetRebalancingHistory", lambda m, r: m.history(r, limit=limit))


class NamespaceAdmin(pb_grpc.NamespaceAdminServicer):
    def __init__(self, admin: _Admin) -> None:
        self.admin = admin

    async def GetNamespaceTopics(self, request, context):
        try:
            return pb.TopicListResponse(topics=list(await self.admin.topics_in(request.name)))
        except DanubeError as exc:
            await abort(context, exc)

    async def GetNamespacePolicies(self, request, context):
        try:
            doc = await self.admin.metadata.get_json(keys.namespace_policy(namespace_name(request.name)))
            return pb.PolicyResponse(policies=json.dumps(doc or {}))
        except DanubeError as exc:
            await abort(context, exc)

    async def CreateNamespace(self, request, context):
        await _unimplemented(context, "CreateNamespace")

    async def DeleteNamespace(self, request, context):
        await _unimplemented(context, "DeleteNamespace")


class TopicAdmin(pb_grpc.TopicAdminServicer):
    def __init__(self, admin: _Admin) -> None:
        self.admin = admin

    async def ListNamespaceTopics(self, request, context):
        try:
            topics = await self.admin.topics_in(request.name)
        except DanubeError as exc:
            await abort(context, exc)
        served = self.admin.broker.topics
        broker_id = str(self.admin.broker.broker_id)
        return pb.TopicInfoListResponse(topics=[
            pb.TopicInfo(name=name, delivery=delivery, broker_id=broker_id if name in served else "")
            for name, delivery in topics.items()])

    async def ListBrokerTopics(self, request, context):
        b = self.admin.broker
        if request.broker_id and request.broker_id != str(b.broker_id):
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"broker {quote(request.broker_id)} is unknown here (this broker is {b.broker_id})")
        return pb.TopicInfoListResponse(topics=[
            pb.TopicInfo(name=name, broker_id=str(b.broker_id), delivery="Reliable" if t.reliable else "NonReliable")
            for name, t in sorted(b.topics.items())])

    async def UnloadTopic(self, request, context):
        cluster = getattr(self.admin.broker, "cluster", None)
        if cluster is not None:  # cluster mode: the owner moves it, wherever the request arrived
            try:
                last = await cluster.unload_anywhere(request.name)
                log.info("admin: unloaded %s in the cluster (last committed offset %s)", request.name, last)
                return pb.TopicResponse(success=True)
            except DanubeError as exc:
                await abort(context, exc)
        try:
            exists, _delivery_name = await self.admin.known(request.name)
            if request.name not in self.admin.broker.topics:
                raise NotFoundError(f"topic {request.name} is not loaded on this broker"
                                    + ("" if exists else " (and no such topic exists)"))
            last = await self.admin.broker.unload_topic(request.name)
            log.info("admin: unloaded %s (last committed offset %s)", request.name, last)
            return pb.TopicResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def ListSubscriptions(self, request, context):
        try:
            exists, _ = await self.admin.known(request.name)
            if not exists:
                raise NotFoundError(f"topic {request.name} does not exist")
            return pb.SubscriptionListResponse(subscriptions=await self.admin.subscriptions(request.name))
        except DanubeError as exc:
            await abort(context, exc)

    async def DescribeTopic(self, request, context):
        try:
            exists, delivery = await self.admin.known(request.name)
            if not exists:
                raise NotFoundError(f"topic {request.name} does not exist")
            served = self.admin.broker.topics.get(request.name)
            response = pb.DescribeTopicResponse(
                name=request.name, subscriptions=await self.admin.subscriptions(request.name),
                broker_id=str(self.admin.broker.broker_id) if served is not None else "", delivery=delivery)
            describe = getattr(getattr(served, "storage", None), "describe", None)
            if served is not None and served.reliable and callable(describe):
                info = describe()
                response.storage.CopyFrom(pb.StorageInfo(
                    mode=info["mode"], first_offset=info["first_offset"], next_offset=info["next_offset"],
                    hot_start_offset=info["hot_start_offset"], durable_end_offset=info["durable_end_offset"],
                    segment_count=info["segment_count"], segment_bytes=info["segment_bytes"],
                    recovered_from=info["recovered_from"], backend=info["backend"],
                    segments=[pb.SegmentInfo(**s) for s in info["segments"]]))
            return response
        except DanubeError as exc:
            await abort(context, exc)

    async def CreateTopic(self, request, context):
        await _unimplemented(context, "CreateTopic (topics are created by their first producer)")

    async def CreatePartitionedTopic(self, request, context):
        await _unimplemented(context, "CreatePartitionedTopic")

    async def DeleteTopic(self, request, context):
        await _unimplemented(context, "DeleteTopic")

    async def Unsubscribe(self, request, context):
        await _unimplemented(context, "Unsubscribe")

    async def SetSubscriptionFailurePolicy(self, request, context):
        await _unimplemented(context, "SetSubscriptionFailurePolicy")

    async def GetSubscriptionFailurePolicy(self, request, context):
        try:
            doc = await self.admin.metadata.get_json(
                keys.subscription_failure_policy(request.topic, request.subscription))
            return pb.FailurePolicyResponse(policy_json=json.dumps(doc or {}))
        except DanubeError as exc:
            await abort(context, exc)

    # ------------------------------------------------------------ live repartition (docs/repartition.md)

    async def RepartitionTopic(self, request, context):
        from danube.routing.repartition import admin as repartition_admin

        try:
            return _partitioning(await repartition_admin.repartition(
                self.admin.broker, request.name, request.partitions))
        except DanubeError as exc:
            await abort(context, exc)

    async def DescribePartitioning(self, request, context):
        from danube.routing.repartition import admin as repartition_admin

        try:
            return _partitioning(await repartition_admin.describe(self.admin.broker, request.name))
        except DanubeError as exc:
            await abort(context, exc)


def _partitioning(d: dict) -> pb.PartitioningResponse:
    response = pb.PartitioningResponse(
        name=d["name"], partitions=d["partitions"], partitioning_version=d["partitioning_version"],
        generation=d["generation"], marker_json=json.dumps(d["marker"]) if d["marker"] else "",
        drained=d["drained"], retired=d["retired"])
    if d["global_adoption"] is not None:
        response.global_adoption = d["global_adoption"]
    if d["adoption_generation"] is not None:
        response.adoption_generation = d["adoption_generation"]
    return response


def add_to_server(server: grpc.aio.Server, broker) -> None:
    """Register Danube's admin services for ``broker`` (a BrokerService) on ``server``."""
    admin = _Admin(broker)
    pb_grpc.add_BrokerAdminServicer_to_server(BrokerAdmin(admin), server)
    pb_grpc.add_NamespaceAdminServicer_to_server(NamespaceAdmin(admin), server)
    pb_grpc.add_TopicAdminServicer_to_server(TopicAdmin(admin), server)
