"""The gRPC face of the scalable topic service (proto/danube_scalable/scalable.proto): each
ScalableTopics call of a client or another broker turned into a call of
:class:`~danube.server.scalable_service.ScalableTopicService`, its errors into gRPC statuses.
A consumer's registration stream stays open and pushes each new assignment until the consumer
leaves or this broker's controller stops leading the topic."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, AsyncIterator

import grpc

from danube.errors import DanubeError
from danube.metadata import keys
from danube.model.segment_layout import SegmentLayout
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from danube.routing.scalable.contracts import STREAM, NotLeaderError
from danube.routing.scalable.segments import BrokerSegmentOps
from danube.server import status as status_map
from danube.server.scalable_forwarding import forwarded_call

if TYPE_CHECKING:
    from danube.server.scalable_service import ScalableTopicService

_abort = status_map.abort


def _layout_reply(layout: SegmentLayout, controller_url: str = "") -> pb.LayoutResponse:
    return pb.LayoutResponse(metadata_json=layout.to_json().decode(), controller_broker_url=controller_url)


class ScalableTopicsServicer(pb_grpc.ScalableTopicsServicer):
    def __init__(self, service: ScalableTopicService) -> None:
        self.service = service

    async def WatchTopic(self, request, context) -> AsyncIterator[pb.ScalableTopicUpdate]:
        try:
            keys.split_topic(request.topic)
            await self.service.store.require(request.topic)
            async for snap in self.service.store.watch(request.topic):
                yield pb.ScalableTopicUpdate(session_id=request.session_id, dag=await self.service.dag(snap))
        except DanubeError as exc:
            await _abort(context, exc)

    async def RegisterConsumer(self, request, context) -> AsyncIterator[pb.AssignmentUpdate]:
        try:
            ctl = await self.service.controller(request.topic)
            if not ctl.is_leader:
                err = NotLeaderError(f"the controller leader of {request.topic} is {ctl.leader_url}", ctl.leader_url)
                err.owner_url = ctl.leader_url  # type: ignore[attr-defined]
                raise err
            queue: asyncio.Queue = asyncio.Queue()
            first = await ctl.register_consumer(
                request.subscription, request.consumer_name, request.consumer_id, queue.put_nowait
            )
        except DanubeError as exc:
            await _abort(context, exc)
            return
        try:
            yield pb.AssignmentUpdate(assignment_json=json.dumps(first.to_json()))
            while True:
                get = asyncio.ensure_future(queue.get())
                lost = asyncio.ensure_future(ctl.changed.wait())
                done, _ = await asyncio.wait({get, lost}, return_when=asyncio.FIRST_COMPLETED)
                if get in done:
                    lost.cancel()
                    yield pb.AssignmentUpdate(assignment_json=json.dumps(get.result().to_json()))
                else:
                    get.cancel()
                    ctl.changed.clear()
                    if not ctl.is_leader:
                        await context.abort(
                            grpc.StatusCode.UNAVAILABLE,
                            f"controller leadership of {request.topic} moved to {ctl.leader_url}",
                        )
        finally:
            ctl.consumer_disconnected(request.subscription, request.consumer_name)

    async def SegmentDrained(self, request, context) -> pb.DeletedResponse:
        try:
            ctl = await self.service.controller(request.topic)
            if not ctl.is_leader:
                return await self.service.remote(ctl.leader_url).SegmentDrained(request, timeout=30)
            return pb.DeletedResponse(deleted=await ctl.segment_drained(request.subscription, request.segment_id))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def CreateScalableTopic(self, request, context) -> pb.LayoutResponse:
        try:
            layout = await self.service.create(request.topic, request.num_segments or 1)
            return _layout_reply(layout, await self.service.store.controller_url(request.topic))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def GetScalableTopic(self, request, context) -> pb.LayoutResponse:
        try:
            stored = await self.service.store.require(request.topic)
            return _layout_reply(stored.layout, await self.service.store.controller_url(request.topic))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def DescribeScalableTopic(self, request, context) -> pb.JsonResponse:
        try:
            return pb.JsonResponse(json=json.dumps(await self.service.describe(request.topic)))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def ListScalableTopics(self, request, context) -> pb.ListScalableTopicsResponse:
        try:
            return pb.ListScalableTopicsResponse(topics=await self.service.store.list(request.namespace or "default"))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def DeleteScalableTopic(self, request, context) -> pb.DeletedResponse:
        try:
            return pb.DeletedResponse(deleted=await self.service.delete(request.topic))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def SplitSegment(self, request, context) -> pb.LayoutResponse:
        try:
            return _layout_reply(await self.service.split(request.topic, request.segment_id), self.service.broker_url)
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def MergeSegments(self, request, context) -> pb.LayoutResponse:
        try:
            layout = await self.service.merge(request.topic, request.segment_id1, request.segment_id2)
            return _layout_reply(layout, self.service.broker_url)
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def CreateSubscription(self, request, context) -> pb.DeletedResponse:
        try:
            created = await self.service.create_subscription(
                request.topic, request.subscription, request.type or STREAM
            )
            return pb.DeletedResponse(deleted=created)
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def DeleteSubscription(self, request, context) -> pb.DeletedResponse:
        try:
            return pb.DeletedResponse(
                deleted=await self.service.delete_subscription(request.topic, request.subscription)
            )
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def ListSubscriptions(self, request, context) -> pb.JsonResponse:
        try:
            return pb.JsonResponse(json=json.dumps(await self.service.subscriptions(request.topic)))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def TerminateSegment(self, request, context) -> pb.JsonResponse:
        try:
            keys.split_topic(request.segment_topic)
            await BrokerSegmentOps.terminate_segment(self.service.ops, request.segment_topic)
            return pb.JsonResponse(json=json.dumps({"terminated": True}))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def SegmentStats(self, request, context) -> pb.JsonResponse:
        """A client's call (a queue consumer checking a sealed segment's backlog) may reach any
        broker: forwarded to the owner once; a forwarded call is answered here."""
        try:
            keys.split_topic(request.segment_topic)
            if forwarded_call(context):
                stats = await BrokerSegmentOps.segment_stats(self.service.ops, request.segment_topic)
            else:
                stats = await self.service.ops.segment_stats(request.segment_topic)
            return pb.JsonResponse(json=json.dumps(stats))
        except DanubeError as exc:
            await _abort(context, exc)
            raise

    async def StoredMessages(self, request, context) -> pb.StoredMessagesResponse:
        """A scalable producer's question (any broker): forwarded to the segment's owner once."""
        try:
            keys.split_topic(request.segment_topic)
            args = (request.segment_topic, request.producer_id, request.after_offset, request.since_publish_time)
            if forwarded_call(context):
                offsets = await BrokerSegmentOps.stored_messages(self.service.ops, *args)
            else:
                offsets = await self.service.ops.stored_messages(*args)
            return pb.StoredMessagesResponse(offsets=offsets)
        except DanubeError as exc:
            await _abort(context, exc)
            raise
