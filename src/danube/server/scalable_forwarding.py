"""Segment operations of the scalable topic service that reach the broker serving the segment.

A scalable topic's controller leader may run on any broker, while each segment topic is served by
the broker the cluster assigned it to.  :class:`ForwardingSegmentOps` is the controller's
``SegmentOps`` here: what only a segment's owner can do (terminate it, read its stats or what a
producer stored in it, delete it with its stored data) goes to that owner over the ScalableTopics service (or its admin port's
DeleteTopic); a call forwarded so is marked, and answered where it lands, never forwarded again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, cast

import grpc

from danube.client.errors import from_rpc_error
from danube.cluster import peers
from danube.errors import NotServedHereError
from danube.metadata import keys
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from danube.routing.scalable.segments import BrokerSegmentOps
from danube.server.admin import _FORWARDED as ADMIN_FORWARDED

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.cluster.node import ClusterNode

FORWARDED_KEY = "x-danube-scalable-forwarded"
FORWARDED_CALL = ((FORWARDED_KEY, "1"),)

Remote = Callable[[str], pb_grpc.ScalableTopicsStub]
"""The ScalableTopics service of the broker at a URL (the service keeps one channel per broker)."""


def forwarded_call(context: Any) -> bool:
    """The call came from another broker's ForwardingSegmentOps (answered here, never forwarded again)."""
    try:
        return any(k == FORWARDED_KEY for k, _v in (context.invocation_metadata() or ()))
    except Exception:  # noqa: BLE001 - no metadata: a client's call
        return False


class ForwardingSegmentOps(BrokerSegmentOps):
    """BrokerSegmentOps whose owner-only calls go to the broker serving the segment."""

    def __init__(self, broker: BrokerService, remote: Remote) -> None:
        super().__init__(broker)
        self.remote = remote

    async def _owner(self, topic: str) -> str:
        result = await self.broker.lookup(topic)
        return result.broker_url if result.kind != "connect" else ""

    async def terminate_segment(self, topic: str) -> None:
        if self.broker.cluster is None:
            return await super().terminate_segment(topic)
        owner = await self._owner(topic)
        if not owner or owner == self.broker.broker_url:
            return await super().terminate_segment(topic)
        await self.metadata.put(keys.topic_terminated(topic), b"1")  # the owner's open reads it, should it move
        await self.remote(owner).TerminateSegment(pb.SegmentRequest(segment_topic=topic), timeout=30)

    async def delete_segment(self, topic: str) -> None:
        """At the broker the cluster assigned the segment to (its admin port's DeleteTopic, which
        deletes the stored data there too); here when it is this broker's or nobody's."""
        cluster = self.broker.cluster
        owner = cluster.view.owner(topic) if cluster is not None else None
        node = cast("ClusterNode", cluster)  # read only with an owner, so in cluster mode
        if owner is None or str(owner) == str(node.broker_id):
            return await super().delete_segment(topic)
        admin_url = (node.view.registered.get(owner) or {}).get("admin_url")
        if not admin_url:
            raise NotServedHereError(f"segment {topic} is owned by broker {owner}, which has no admin port")
        try:
            async with peers.for_broker(self.broker).channel(admin_url) as channel:  # as this broker
                await admin_grpc.TopicAdminStub(channel).DeleteTopic(
                    admin_pb.TopicRequest(name=topic), timeout=60, metadata=((ADMIN_FORWARDED, "1"),)
                )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # gone already: deleted
                raise from_rpc_error(exc) from exc

    async def backlog(self, topic: str, subscription: str) -> int:
        stats = await self.segment_stats(topic)
        return int(stats.get("subscriptions", {}).get(subscription, {}).get("backlog", 0))

    async def segment_stats(self, topic: str) -> dict[str, Any]:
        if self.broker.cluster is not None and topic not in self.broker.topics:
            owner = await self._owner(topic)
            if owner and owner != self.broker.broker_url:
                reply = await self.remote(owner).SegmentStats(
                    pb.SegmentRequest(segment_topic=topic), timeout=30, metadata=FORWARDED_CALL
                )
                return dict(json.loads(reply.json))
        return await super().segment_stats(topic)

    async def stored_messages(self, topic: str, producer_id: int, after_offset: int, since_ms: int) -> list[int]:
        if self.broker.cluster is not None and topic not in self.broker.topics:
            owner = await self._owner(topic)
            if owner and owner != self.broker.broker_url:
                reply = await self.remote(owner).StoredMessages(
                    pb.StoredMessagesRequest(
                        segment_topic=topic,
                        producer_id=producer_id,
                        after_offset=after_offset,
                        since_publish_time=since_ms,
                    ),
                    timeout=30,
                    metadata=FORWARDED_CALL,
                )
                return list(reply.offsets)
        return await super().stored_messages(topic, producer_id, after_offset, since_ms)
