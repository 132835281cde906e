"""Danube's ``TopicAdmin`` service: topics (list, describe, create, delete, unload), their
subscriptions and failure policies, live repartition.

Calls the topic's owner must act on (describe, subscriptions, unsubscribe, delete; unload through
the cluster node) are forwarded to the owner's admin port (``AdminContext.forward``).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, cast

import grpc

from danube.broker.policies import FailurePolicy
from danube.cluster import peers
from danube.errors import AlreadyExistsError, DanubeError, InvalidArgumentError, NotFoundError, quote
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2 as pb
from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.server import failure_policy_wire
from danube.server.admin_context import AdminContext, forwarded
from danube.server.status import abort

if TYPE_CHECKING:
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)


class TopicAdmin(pb_grpc.TopicAdminServicer):
    def __init__(self, admin: AdminContext) -> None:
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
            refusal = None if forwarded(context) else await self._partition_refusal(request.name)
        except DanubeError as exc:
            await abort(context, exc)
        if refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        if isinstance(count, int) and count > 0 and not forwarded(context):  # a partitioned topic: every partition
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
        if not forwarded(context):
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
