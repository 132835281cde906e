"""Danube's admin gRPC service (package ``danube_admin``) for one broker.

``add_to_server(server, broker)`` registers BrokerAdmin, NamespaceAdmin and
TopicAdmin on a ``grpc.aio`` server (the admin port, 50051 by default).
Topic and namespace listings read the metadata store (every topic the cluster
knows), the cluster view's assignments and the broker (topics served here), so
every broker of a cluster gives the same answer.  Calls the topic's owner must
act on (describe, subscriptions, unsubscribe, delete; unload through the
cluster node) are forwarded to the owner's admin port (the view has its
admin_url), marked so the owner answers itself.  Drain/rebalancing calls
answer UNIMPLEMENTED on a standalone broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, cast

import grpc

from danube.broker.policies import FailurePolicy
from danube.cluster import peers
from danube.errors import AlreadyExistsError, DanubeError, InvalidArgumentError, NotFoundError, quote
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.server import failure_policy_wire
from danube.server.status import abort

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)


def namespace_name(namespace: str) -> str:
    """A namespace as Danube's admin CLI sends it (``default`` or ``/default``), checked by the
    project's name rule."""
    ns = namespace[1:] if isinstance(namespace, str) and namespace.startswith("/") else namespace
    return keys.check_namespace(ns)


def _delivery(doc: Any) -> str:
    strategy = (doc or {}).get("dispatch_strategy", "") if isinstance(doc, dict) else ""
    return "Reliable" if str(strategy).lower() == "reliable" else "NonReliable"


# Listings built at once over all keys (the admin port shares the broker's event loop with the
# client port, so many concurrent listings must not take its CPU).
LISTINGS_AT_ONCE = 4


class _Listings:
    """Coalesced listings: calls for the same listing share one build that started after they
    arrived (so none misses what existed when it was made), at most one build running and one
    pending per listing, and at most ``LISTINGS_AT_ONCE`` builds over all listings.  A thousand
    concurrent ``topics list`` calls cost two builds, not a thousand."""

    def __init__(self) -> None:
        self._running: dict[Any, asyncio.Future] = {}
        self._pending: dict[Any, asyncio.Future] = {}
        self._gate = asyncio.Semaphore(LISTINGS_AT_ONCE)

    async def get(self, key: Any, build: Callable[[], Awaitable[Any]]) -> Any:
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = asyncio.ensure_future(self._build(key, build, self._running.get(key)))
        return await asyncio.shield(pending)

    async def _build(self, key: Any, build: Callable[[], Awaitable[Any]], before: asyncio.Future | None) -> Any:
        if before is not None:
            await asyncio.wait((before,))  # its outcome is its callers'; this build starts after it
        me = self._pending.pop(key)
        self._running[key] = me
        try:
            async with self._gate:
                return await build()
        finally:
            if self._running.get(key) is me:
                del self._running[key]


class _Admin:
    """Shared lookups over the broker and its metadata store."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.metadata = broker.metadata
        self.listings = _Listings()

    async def topics_in(self, namespace: str) -> dict[str, str]:
        """``{topic: delivery}`` for every topic of ``namespace`` known to metadata or served here."""
        ns = namespace_name(namespace)
        out: dict[str, str] = {}
        fields: dict[str, set[str]] = {}
        for kv in await self.metadata.get_prefix(f"/topics/{ns}/"):
            parts = kv.key.split("/")  # ['', 'topics', ns, topic, field, ...]
            if len(parts) >= 5:
                name = f"/{ns}/{parts[3]}"
                fields.setdefault(name, set()).add(parts[4])
                if parts[4] == "delivery":
                    out[name] = _delivery(json.loads(kv.value))
                else:
                    out.setdefault(name, "")
        for name, names in fields.items():  # the base name of a partitioned topic is no topic (its partitions are)
            if names == {"partitions"}:
                out.pop(name, None)
        for name, topic in self.broker.topics.items():
            if keys.split_topic(name)[0] == ns:
                out[name] = "Reliable" if topic.reliable else "NonReliable"
        if self.cluster is not None:  # assigned somewhere in the cluster (the view), even if not yet in metadata
            for name in list(self.cluster.view.assignments):
                if name.startswith(f"/{ns}/"):
                    out.setdefault(name, "")
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
        if self.cluster is not None:
            for name in list(self.cluster.view.assignments):
                names.add(name.split("/")[1])
        return sorted(n for n in names if n)

    async def subscriptions(self, topic: str) -> list[str]:
        keys.split_topic(topic)
        names = set()
        prefix = keys.topic_subscriptions(topic)
        for kv in await self.metadata.get_prefix(prefix):
            sub = kv.key[len(prefix) :].split("/", 1)[0]
            if sub:
                names.add(sub)
        served = self.broker.topics.get(topic)
        if served is not None:
            names.update(served.subscriptions.keys())
        return sorted(names)

    @property
    def cluster(self):
        return self.broker.cluster

    def owner(self, topic: str) -> str:
        """The broker serving ``topic`` ("" when none): the cluster view's assignment, else this broker."""
        cluster = self.cluster
        if cluster is not None:
            owner = cluster.view.owner(topic)
            if owner is not None:
                return str(owner)
        return str(self.broker.broker_id) if topic in self.broker.topics else ""

    def remote_owner(self, topic: str, context) -> str | None:
        """The owner's id when the request must go to another broker's admin port: cluster mode, the
        topic assigned elsewhere, and the request not already forwarded (no loops)."""
        cluster = self.cluster
        if cluster is None or _forwarded(context):
            return None
        owner = cluster.view.owner(topic)
        return owner if owner is not None and str(owner) != str(cluster.broker_id) else None

    async def forward(self, broker_id: str, method: str, request, context, stub=pb_grpc.TopicAdminStub):
        """``TopicAdmin.method(request)`` (or ``stub``'s) at ``broker_id``'s admin port; its reply, or its error (same code).
        It carries the caller's token, so RBAC at the owner judges the caller (danube.cluster.peers)."""
        info = self.cluster.view.registered.get(broker_id) or {}
        admin_url = info.get("admin_url")
        if not admin_url:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"broker {broker_id} has no admin port registered")
        channels, caller = peers.for_broker(self.broker), peers.caller_authorization(context)
        try:
            async with channels.channel(cast(str, admin_url), caller=caller) as channel:  # aborted without one
                call = getattr(stub(channel), method)
                return await call(request, timeout=60, metadata=((_FORWARDED, "1"),))
        except grpc.aio.AioRpcError as exc:
            await context.abort(
                exc.code(), f"at broker {broker_id}: {channels.explain(exc, as_broker=channels.runs_as_broker(caller))}"
            )

    def registry(self):
        """The broker's schema registry (the one its gate follows), else one over the metadata store."""
        gate = self.broker.schema_gate
        if gate is not None:
            return gate.registry
        from danube.schema.registry import SchemaRegistry

        return SchemaRegistry(self.metadata)

    async def known(self, topic: str) -> tuple[bool, str]:
        """(exists, delivery) of a topic."""
        keys.split_topic(topic)
        served = self.broker.topics.get(topic)
        if served is not None:
            return True, "Reliable" if served.reliable else "NonReliable"
        doc = await self.metadata.get_json(keys.topic_delivery(topic))
        return doc is not None, _delivery(doc)


_FORWARDED = "x-danube-admin-forwarded"


def _forwarded(context) -> bool:
    """Whether the call came from another broker's admin service (answered here, never forwarded again)."""
    try:
        return any(k == _FORWARDED for k, _v in (context.invocation_metadata() or ()))
    except Exception:  # noqa: BLE001 - no metadata: a client's call
        return False


async def _unimplemented(context, what: str) -> None:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{what} is not available on a standalone broker yet (it comes with the cluster layer)",
    )


class BrokerAdmin(pb_grpc.BrokerAdminServicer):
    def __init__(self, admin: _Admin) -> None:
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
            await _unimplemented(context, "UnloadBroker")
        assert cluster is not None  # _unimplemented aborted the call without one
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
            await _unimplemented(context, "ActivateBroker")
        assert cluster is not None  # _unimplemented aborted the call without one
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
        cluster = self.admin.cluster
        if (
            cluster is not None
            and not _forwarded(context)
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
    def __init__(self, admin: _Admin) -> None:
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


class TopicAdmin(pb_grpc.TopicAdminServicer):
    def __init__(self, admin: _Admin) -> None:
        self.admin = admin

    async def ListNamespaceTopics(self, request, context):
        async def build():
            topics = await self.admin.topics_in(request.name)
            return pb.TopicInfoListResponse(
                topics=[
                    pb.TopicInfo(name=name, delivery=delivery, broker_id=self.admin.owner(name))
                    for name, delivery in topics.items()
                ]
            )

        try:
            return await self.admin.listings.get(("infos", request.name), build)
        except DanubeError as exc:
            await abort(context, exc)

    async def ListBrokerTopics(self, request, context):
        b = self.admin.broker
        cluster = self.admin.cluster
        if cluster is not None:  # cluster mode: the view's assignments of that broker (default: this one)
            broker_id = request.broker_id or str(cluster.broker_id)
            if broker_id not in cluster.view.registered and broker_id not in cluster.view.broker_topics:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"broker {quote(broker_id)} is not registered")
            out = []
            try:
                for name in sorted(cluster.view.broker_topics.get(broker_id, ())):
                    out.append(pb.TopicInfo(name=name, broker_id=broker_id, delivery=(await self.admin.known(name))[1]))
            except DanubeError as exc:
                await abort(context, exc)
            return pb.TopicInfoListResponse(topics=out)
        if request.broker_id and request.broker_id != str(b.broker_id):
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"broker {quote(request.broker_id)} is unknown here (this broker is {b.broker_id})",
            )
        return pb.TopicInfoListResponse(
            topics=[
                pb.TopicInfo(
                    name=name, broker_id=str(b.broker_id), delivery="Reliable" if t.reliable else "NonReliable"
                )
                for name, t in sorted(b.topics.items())
            ]
        )

    async def UnloadTopic(self, request, context):
        cluster = self.admin.broker.cluster
        if cluster is not None:  # cluster mode: the owner moves it, wherever the request arrived
            try:
                last = await cluster.unload_anywhere(request.name, caller=peers.caller_authorization(context))
                log.info("admin: unloaded %s in the cluster (last committed offset %s)", request.name, last)
                return pb.TopicResponse(success=True)
            except DanubeError as exc:
                await abort(context, exc)
        try:
            exists, _delivery_name = await self.admin.known(request.name)
            if request.name not in self.admin.broker.topics:
                raise NotFoundError(
                    f"topic {request.name} is not loaded on this broker"
                    + ("" if exists else " (and no such topic exists)")
                )
            last = await self.admin.broker.unload_topic(request.name)
            log.info("admin: unloaded %s (last committed offset %s)", request.name, last)
            return pb.TopicResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def ListSubscriptions(self, request, context):
        owner = self.admin.remote_owner(request.name, context)
        if owner is not None:  # the owner also knows subscriptions whose cursor is not flushed yet
            return await self.admin.forward(owner, "ListSubscriptions", request, context)
        try:
            exists, _ = await self.admin.known(request.name)
            if not exists:
                raise NotFoundError(f"topic {request.name} does not exist")
            return pb.SubscriptionListResponse(subscriptions=await self.admin.subscriptions(request.name))
        except DanubeError as exc:
            await abort(context, exc)

    async def DescribeTopic(self, request, context):
        owner = self.admin.remote_owner(request.name, context)
        if owner is not None:  # storage figures live on the owner
            return await self.admin.forward(owner, "DescribeTopic", request, context)
        try:
            exists, delivery = await self.admin.known(request.name)
            if not exists:
                raise NotFoundError(f"topic {request.name} does not exist")
            served = self.admin.broker.topics.get(request.name)
            response = pb.DescribeTopicResponse(
                name=request.name,
                subscriptions=await self.admin.subscriptions(request.name),
                broker_id=self.admin.owner(request.name),
                delivery=delivery,
            )
            await self._schema_fields(request.name, response)
            describe = getattr(getattr(served, "storage", None), "describe", None)
            if served is not None and served.reliable and callable(describe):
                info = describe()
                response.storage.CopyFrom(
                    pb.StorageInfo(
                        mode=info["mode"],
                        first_offset=info["first_offset"],
                        next_offset=info["next_offset"],
                        hot_start_offset=info["hot_start_offset"],
                        durable_end_offset=info["durable_end_offset"],
                        segment_count=info["segment_count"],
                        segment_bytes=info["segment_bytes"],
                        recovered_from=info["recovered_from"],
                        backend=info["backend"],
                        segments=[pb.SegmentInfo(**s) for s in info["segments"]],
                    )
                )
            return response
        except DanubeError as exc:
            await abort(context, exc)

    async def _schema_fields(self, topic: str, response) -> None:
        """Danube's schema fields of a described topic: its subject (a partition follows its
        partitioned topic), and the subject's latest version, type and compatibility mode; all
        unset for a topic without a subject, only the subject when it has no live version."""
        from danube.schema.registry import base_topic

        registry = self.admin.registry()
        cfg = await registry.topic_config(topic)
        if not cfg.subject and base_topic(topic) != topic:
            cfg = await registry.topic_config(base_topic(topic))
        if not cfg.subject:
            return
        response.schema_subject = cfg.subject
        try:
            latest = await registry.latest(cfg.subject)
        except DanubeError:
            return
        response.schema_id = latest.schema_id
        response.schema_version = latest.version
        response.schema_type = latest.schema_type
        response.compatibility_mode = str(latest.compatibility_mode).upper()  # Danube's enum case

    async def _check_subject(self, request) -> str | None:
        """The requested schema subject, refused before anything is created when the registry has
        no such subject (a topic must not be left behind half configured)."""
        if not request.HasField("schema_subject") or not request.schema_subject:
            return None
        await self.admin.registry().latest(request.schema_subject)
        return request.schema_subject

    async def _attach_subject(self, topic: str, subject: str | None) -> None:
        if subject is not None:
            await self.admin.registry().configure_topic(topic, subject)

    async def _create(self, topic: str, strategy: int) -> None:
        """The topic's delivery document in metadata (what its first producer would write); in cluster
        mode it is then placed on a broker through a lookup, like Danube's create."""
        keys.split_topic(topic)
        exists, _ = await self.admin.known(topic)
        if exists:
            raise AlreadyExistsError(f"topic {topic} already exists")
        await self.admin.metadata.put_json(
            keys.topic_delivery(topic), {"dispatch_strategy": "reliable" if strategy == pb.Reliable else "non_reliable"}
        )

    async def _place(self, topics: list[str]) -> None:
        if self.admin.cluster is None:
            return
        for topic in topics:
            try:
                await self.admin.broker.lookup(topic)
            except Exception as exc:  # noqa: BLE001 - placed on its first lookup otherwise
                log.warning("admin: created %s, not placed yet: %s", topic, exc)

    async def CreateTopic(self, request, context):
        try:
            subject = await self._check_subject(request)
            await self._create(request.name, request.dispatch_strategy)
            await self._attach_subject(request.name, subject)
            await self._place([request.name])
            return pb.TopicResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def CreatePartitionedTopic(self, request, context):
        try:
            if request.partitions < 1:
                raise InvalidArgumentError("partitions must be at least 1")
            keys.split_topic(request.base_name)
            if await self.admin.metadata.get(keys.topic_partitions(request.base_name)) is not None:
                raise AlreadyExistsError(f"partitioned topic {request.base_name} already exists")
            subject = await self._check_subject(request)
            names = [f"{request.base_name}-part-{i}" for i in range(request.partitions)]
            for name in names:
                await self._create(name, request.dispatch_strategy)
            await self.admin.metadata.put(keys.topic_partitions(request.base_name), str(request.partitions).encode())
            await self._attach_subject(request.base_name, subject)  # every partition follows its base
            await self._place(names)
            return pb.TopicResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def DeleteTopic(self, request, context):
        """The owner stops serving it (its clients get CLOSE), its metadata and assignment go, then
        its stored data (StorageFactory.delete_topic); a producer that comes back creates the
        topic anew, empty."""
        try:
            count = await self.admin.metadata.get_json(keys.topic_partitions(request.name))
            # a forwarded call is a partitioned topic's own deletion reaching a partition's owner
            refusal = None if _forwarded(context) else await self._partition_refusal(request.name)
        except DanubeError as exc:
            await abort(context, exc)
        if refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if isinstance(count, int) and count > 0 and not _forwarded(context):  # a partitioned topic: every partition
            for i in range(count):
                part = pb.TopicRequest(name=f"{request.name}-part-{i}")
                owner = self.admin.remote_owner(part.name, context)
                if owner is not None:
                    await self.admin.forward(owner, "DeleteTopic", part, context)
                elif (await self.admin.known(part.name))[0] or self.admin.owner(part.name):
                    await self._delete_here(part.name, context)
            await self.admin.metadata.delete_prefix(keys.topic_root(request.name) + "/")
            await self._forget_subject(request.name, context)
            return pb.TopicResponse(success=True)
        owner = self.admin.remote_owner(request.name, context)
        if owner is not None:
            response = await self.admin.forward(owner, "DeleteTopic", request, context)
        else:
            response = await self._delete_here(request.name, context)
        await self._forget_subject(request.name, context)
        return response

    async def _partition_refusal(self, topic: str) -> str | None:
        """Why ``topic`` cannot be deleted alone: it is one partition of a partitioned topic (its
        producers would route to a gap).  Danube's wording, so its users and scripts recognise it."""
        from danube.schema.registry import base_topic

        base = base_topic(topic)
        if base != topic and await self.admin.metadata.get(keys.topic_partitions(base)) is not None:
            return (
                f"Cannot delete individual partition '{topic}'. Delete the base topic instead "
                f"('{base}' deletes every partition)."
            )
        return None

    async def _forget_subject(self, topic: str, context) -> None:
        """A deleted topic's schema configuration goes with it (a topic created again starts without)."""
        if not _forwarded(context):
            try:
                await self.admin.registry().forget_topic(topic)
            except DanubeError as exc:
                log.warning("admin: deleted %s, its schema configuration stays: %s", topic, exc)

    async def _delete_here(self, topic: str, context):
        try:
            exists, _ = await self.admin.known(topic)
            cluster = self.admin.cluster
            assigned = cluster is not None and cluster.view.owner(topic) is not None
            if not exists and not assigned:
                raise NotFoundError(f"topic {topic} does not exist")
            broker = self.admin.broker

            async def unload() -> None:
                # unloaded before its metadata goes: the unload's last cursor flush must not write
                # a cursor back (a topic created again would start at that old floor)
                if topic in broker.topics:
                    await broker.unload_topic(topic, local=True, seal=False)
                await self.admin.metadata.delete_prefix(keys.topic_root(topic) + "/")
                await self.admin.metadata.delete(keys.topic_root(topic))
                if cluster is not None:
                    for broker_id in {cluster.view.owner(topic), str(cluster.broker_id)} - {None}:
                        await self.admin.metadata.delete(keys.broker_topic(broker_id, topic))
                    await self.admin.metadata.delete(keys.unassigned(topic))

            factory = broker.storage_factory
            if factory is not None:  # its files go once it is closed here and no open can start
                await factory.delete_topic(topic, unload=unload)
            else:
                await unload()
            log.info("admin: deleted topic %s", topic)
            return pb.TopicResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def Unsubscribe(self, request, context):
        """Drops the subscription (its cursor and registrations) at the topic's owner; refused while
        consumers are attached."""
        owner = self.admin.remote_owner(request.topic, context)
        if owner is not None:
            return await self.admin.forward(owner, "Unsubscribe", request, context)
        try:
            topic, name = request.topic, request.subscription
            if name not in await self.admin.subscriptions(topic):
                raise NotFoundError(f"topic {topic} has no subscription {quote(name)}")
            served = self.admin.broker.topics.get(topic)
            sub = served.subscriptions.get(name) if served is not None else None
            if sub is not None:
                if sub.active_consumers():
                    await context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"subscription {quote(name)} of {topic} has consumers attached",
                    )
                cast("Topic", served).subscriptions.pop(name, None)  # sub was found in it
            await self.admin.metadata.delete_prefix(keys.subscription(topic, name) + "/")
            await self.admin.metadata.delete(keys.subscription(topic, name))
            log.info("admin: unsubscribed %s from %s", name, topic)
            return pb.SubscriptionResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def SetSubscriptionFailurePolicy(self, request, context):
        """Danube's ``SubscriptionFailurePolicy`` message: checked, stored in the shared metadata
        store (a subscription reads it when its topic is loaded) and applied at once to the
        subscription if this broker serves it.  In a cluster the topic's owner does it: only the
        owner holds the live subscription, which would otherwise keep the old policy until the
        topic reloads."""
        try:
            if not request.HasField("failure_policy"):
                raise InvalidArgumentError("failure_policy is required")
            keys.split_topic(request.topic)
            policy = failure_policy_wire.from_wire(request.failure_policy)
            if await self.admin.metadata.get(keys.topic_partitions(request.topic)) is not None:
                # its subscriptions live on its partitions: a policy stored under the base name
                # would apply to none of them (Danube refuses it too)
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{request.topic} is a partitioned topic; set the failure policy on each "
                    f"partition ({request.topic}-part-0, ...)",
                )
            exists, delivery = await self.admin.known(request.topic)
            if not exists:
                raise NotFoundError(f"topic {request.topic} does not exist")
            if delivery != "Reliable":
                # a non-reliable subscription never redelivers: a stored policy would be a promise
                # nothing keeps (Danube refuses it with this status and sentence)
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "subscription failure policy can only be configured for reliable topics "
                    f"({request.topic} is non-reliable)",
                )
            owner = self.admin.remote_owner(request.topic, context)
            if owner is not None:  # checked here first: bad input is refused without a hop
                return await self.admin.forward(owner, "SetSubscriptionFailurePolicy", request, context)
            await self.admin.metadata.put_json(
                keys.subscription_failure_policy(request.topic, request.subscription), policy.to_dict()
            )
            served = self.admin.broker.topics.get(request.topic)
            sub = served.subscriptions.get(request.subscription) if served is not None else None
            if sub is not None:
                sub.failure_policy = policy
            return pb.SubscriptionResponse(success=True)
        except DanubeError as exc:
            await abort(context, exc)

    async def GetSubscriptionFailurePolicy(self, request, context):
        """The stored policy, else the live subscription's (the broker default); asked of the
        owner in a cluster, which alone knows the live subscription and its type."""
        try:
            keys.split_topic(request.topic)
            owner = self.admin.remote_owner(request.topic, context)
            if owner is not None:
                return await self.admin.forward(owner, "GetSubscriptionFailurePolicy", request, context)
            doc = await self.admin.metadata.get_json(
                keys.subscription_failure_policy(request.topic, request.subscription)
            )
            served = self.admin.broker.topics.get(request.topic)
            sub = served.subscriptions.get(request.subscription) if served is not None else None
            response = pb.GetSubscriptionFailurePolicyResponse(
                subscription_type=failure_policy_wire.SUB_TYPE_NUMBERS.get(sub.sub_type, 0) if sub else 0
            )
            if doc:
                response.failure_policy.CopyFrom(failure_policy_wire.to_wire(FailurePolicy.from_dict(doc)))
            elif sub is not None:
                response.failure_policy.CopyFrom(failure_policy_wire.to_wire(sub.failure_policy))
            return response
        except DanubeError as exc:
            await abort(context, exc)

    # ------------------------------------------------------------ live repartition (docs/repartition.md)

    async def RepartitionTopic(self, request, context):
        from danube.routing.repartition import admin as repartition_admin

        try:
            return _partitioning(
                await repartition_admin.repartition(self.admin.broker, request.name, request.partitions)
            )
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
        name=d["name"],
        partitions=d["partitions"],
        partitioning_version=d["partitioning_version"],
        generation=d["generation"],
        marker_json=json.dumps(d["marker"]) if d["marker"] else "",
        drained=d["drained"],
        retired=d["retired"],
        progress_json=json.dumps(d["progress"], sort_keys=True) if d.get("progress") else "",
    )
    if d["global_adoption"] is not None:
        response.global_adoption = d["global_adoption"]
    if d["adoption_generation"] is not None:
        response.adoption_generation = d["adoption_generation"]
    return response


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> None:
    """Register Danube's admin services for ``broker`` (a BrokerService) on ``server``."""
    admin = _Admin(broker)
    pb_grpc.add_BrokerAdminServicer_to_server(BrokerAdmin(admin), server)
    pb_grpc.add_NamespaceAdminServicer_to_server(NamespaceAdmin(admin), server)
    pb_grpc.add_TopicAdminServicer_to_server(TopicAdmin(admin), server)
