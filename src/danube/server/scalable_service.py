"""Scalable topics on the client port (proto/danube_scalable/scalable.proto; docs/scalable-topics.md).

:class:`ScalableTopicService` is PIP-468's per-broker singleton: it keeps one
:class:`~danube.routing.scalable.controller.ScalableTopicController` per scalable topic this
broker was asked about (each takes part in that topic's election), serves DAG watch sessions
from the metadata store, and forwards what only the controller leader may do (split, merge,
subscriptions, consumer registration answers NotLeaderError with the leader's URL) to the
leader over this same service.  Segment terminations go to the broker serving the segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, cast

import grpc

from danube._tasks import cancel_and_wait
from danube.client.errors import from_rpc_error
from danube.cluster import peers
from danube.errors import DanubeError, NotServedHereError
from danube.metadata import keys
from danube.metadata.store import LeaseNotFoundError
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from danube.routing.scalable.controller import (
    DEFAULT_GRACE_SECONDS,
    STREAM,
    NotLeaderError,
    ScalableTopicController,
    create_scalable_topic,
    delete_scalable_topic,
)
from danube.routing.scalable.segments import BrokerSegmentOps
from danube.routing.scalable.store import ScalableTopicStore, TopicSnapshot
from danube.server import status as status_map
from danube.server.admin import _FORWARDED as ADMIN_FORWARDED

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.cluster.node import ClusterNode

log = logging.getLogger(__name__)

_abort = status_map.abort


class OwnLease:
    """A lease of the scalable topic service's own, kept alive (a standalone broker has no membership)."""

    def __init__(self, metadata: Any, ttl: int = 10) -> None:
        self.metadata = metadata
        self.ttl = ttl
        self.lease_id = 0
        self.fenced = False
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.lease_id = await self.metadata.grant_lease(self.ttl)
        self._task = asyncio.get_running_loop().create_task(self._keepalive(), name="scalable-lease")

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.metadata.keepalive(self.lease_id)
            except LeaseNotFoundError:
                self.lease_id = await self.metadata.grant_lease(self.ttl)
            except Exception as exc:  # noqa: BLE001 - keep renewing
                log.warning("scalable topics lease renewal: %s", exc)

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        if self.lease_id:
            with contextlib.suppress(Exception):
                await self.metadata.revoke_lease(self.lease_id)


class ForwardingSegmentOps(BrokerSegmentOps):
    """BrokerSegmentOps whose owner-only calls go to the broker serving the segment."""

    def __init__(self, broker: BrokerService, service: "ScalableTopicService") -> None:
        super().__init__(broker)
        self.service = service

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
        await self.service.remote(owner).TerminateSegment(pb.SegmentRequest(segment_topic=topic), timeout=30)

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
                reply = await self.service.remote(owner).SegmentStats(
                    pb.SegmentRequest(segment_topic=topic), timeout=30, metadata=_FORWARDED_CALL
                )
                return dict(json.loads(reply.json))
        return await super().segment_stats(topic)


class ScalableTopicService:
    def __init__(
        self,
        broker: BrokerService,
        *,
        broker_url: str | None = None,
        lease: Any = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        lease_ttl: int = 10,
        auto_split: dict[str, Any] | None = None,
        prune: dict[str, Any] | None = None,
    ) -> None:
        self.broker = broker
        self.metadata = broker.metadata
        self.broker_url = broker_url or broker.broker_url
        self.store = ScalableTopicStore(self.metadata)
        self.ops = ForwardingSegmentOps(broker, self)
        self.grace_seconds = grace_seconds
        self._lease = lease
        self._own_lease: OwnLease | None = None
        self.lease_ttl = lease_ttl
        self.auto_split = auto_split or {}  # ScalableTopicController auto_split_* / max_segments options
        self.prune = prune or {}  # ScalableTopicController prune_interval / sealed_retention
        self.controllers: dict[str, ScalableTopicController] = {}
        self._lock = asyncio.Lock()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sessions = itertools.count(1)

    def start(self) -> None:
        """Nothing runs in the background: a terminated segment topic reopened on any broker (a move,
        a restart) refuses publishes from its terminated marker, which the broker reads before it
        serves the topic (``BrokerService.terminate_topic``)."""

    # ------------------------------------------------------------ controllers

    async def _lease_source(self) -> Any:
        if self._lease is None:
            cluster = self.broker.cluster
            membership = getattr(cluster, "membership", None)
            if membership is not None:
                self._lease = membership
            else:
                self._own_lease = OwnLease(self.metadata, self.lease_ttl)
                await self._own_lease.start()
                self._lease = self._own_lease
        return self._lease

    async def controller(self, topic: str) -> ScalableTopicController:
        """PIP-468's getOrCreateController: started, and the topic's leader known."""
        ctl = self.controllers.get(topic)
        if ctl is None:
            async with self._lock:
                ctl = self.controllers.get(topic)
                if ctl is None:
                    ctl = ScalableTopicController(
                        topic,
                        self.store,
                        self.ops,
                        await self._lease_source(),
                        self.broker_url,
                        grace_seconds=self.grace_seconds,
                        step_hook=_crash_hook(),
                        **self.auto_split,
                        **self.prune,
                    )
                    await ctl.start()
                    self.controllers[topic] = ctl
        await ctl.wait_leader()
        return ctl

    async def release(self, topic: str) -> None:
        ctl = self.controllers.pop(topic, None)
        if ctl is not None:
            await ctl.stop()

    def remote(self, url: str) -> pb_grpc.ScalableTopicsStub:
        channel = self._channels.get(url)
        if channel is None:
            # as this broker: every ScalableTopics call a broker takes needs admin on the cluster
            # (danube.server.auth.guard), so acting for the caller could not widen its rights
            channel = peers.for_broker(self.broker).channel(url)
            self._channels[url] = channel
        return pb_grpc.ScalableTopicsStub(channel)

    async def stop(self) -> None:
        for topic in list(self.controllers):
            await self.release(topic)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
        if self._own_lease is not None:
            await self._own_lease.stop()

    # ------------------------------------------------------------ operations (local or forwarded)

    async def create(self, topic: str, num_segments: int) -> SegmentLayout:
        layout = await create_scalable_topic(self.store, self.ops, topic, max(1, num_segments))
        await self.controller(topic)
        return layout

    async def delete(self, topic: str) -> bool:
        await self.release(topic)
        return await delete_scalable_topic(self.store, self.ops, topic)

    async def split(self, topic: str, segment_id: int) -> SegmentLayout:
        ctl = await self.controller(topic)
        if not ctl.is_leader:
            reply = await self.remote(ctl.leader_url).SplitSegment(
                pb.SplitSegmentRequest(topic=topic, segment_id=segment_id), timeout=60
            )
            return SegmentLayout.from_json(reply.metadata_json)
        return await ctl.split_segment(segment_id)

    async def merge(self, topic: str, id1: int, id2: int) -> SegmentLayout:
        ctl = await self.controller(topic)
        if not ctl.is_leader:
            reply = await self.remote(ctl.leader_url).MergeSegments(
                pb.MergeSegmentsRequest(topic=topic, segment_id1=id1, segment_id2=id2), timeout=60
            )
            return SegmentLayout.from_json(reply.metadata_json)
        return await ctl.merge_segments(id1, id2)

    async def create_subscription(self, topic: str, sub: str, kind: str) -> bool:
        ctl = await self.controller(topic)
        if not ctl.is_leader:
            reply = await self.remote(ctl.leader_url).CreateSubscription(
                pb.ScalableSubscriptionRequest(topic=topic, subscription=sub, type=kind), timeout=60
            )
            return bool(reply.deleted)
        return await ctl.create_subscription(sub, kind or STREAM)

    async def delete_subscription(self, topic: str, sub: str) -> bool:
        ctl = await self.controller(topic)
        if not ctl.is_leader:
            reply = await self.remote(ctl.leader_url).DeleteSubscription(
                pb.ScalableSubscriptionRequest(topic=topic, subscription=sub), timeout=60
            )
            return bool(reply.deleted)
        return await ctl.delete_subscription(sub)

    async def subscriptions(self, topic: str) -> dict:
        await self.store.require(topic)
        out = {}
        for sub, doc in (await self.store.subscriptions(topic)).items():
            consumers = await self.store.consumers(topic, sub)
            out[sub] = {
                "type": doc.get("type", STREAM),
                "drainedSegments": doc.get("drainedSegments", []),
                "consumers": {
                    name: [s["segmentId"] for s in reg.get("assignedSegments", [])] for name, reg in consumers.items()
                },
            }
        return out

    async def describe(self, topic: str) -> dict:
        stored = await self.store.require(topic)
        layout = stored.layout
        segments = []
        for seg in layout.segments.values():
            name = segment_topic_name(topic, seg)
            try:
                stats = await self.ops.segment_stats(name)
            except DanubeError as exc:
                stats = {"error": str(exc)}
            segments.append({**seg.to_json(), "topic": name, "stats": stats})
        return {
            "topic": topic,
            "epoch": layout.epoch,
            "nextSegmentId": layout.next_segment_id,
            "controller": await self.store.controller_url(topic),
            "activeSegments": [s.segment_id for s in layout.active_segments],
            "segments": segments,
            "subscriptions": await self.subscriptions(topic),
        }

    async def dag(self, snap: TopicSnapshot) -> pb.ScalableTopicDAG:
        if snap.layout is None:
            return pb.ScalableTopicDAG(deleted=True, controller_broker_url=snap.controller_url)
        dag = pb.ScalableTopicDAG(
            epoch=snap.layout.epoch,
            controller_broker_url=snap.controller_url,
            metadata_json=snap.layout.to_json().decode(),
        )
        for seg in snap.layout.segments.values():
            name = segment_topic_name(snap.topic, seg)
            dag.segments.append(
                pb.SegmentInfoProto(
                    segment_id=seg.segment_id,
                    hash_range=pb.HashRange(start=seg.hash_range.start, end=seg.hash_range.end),
                    state=pb.ACTIVE if seg.is_active else pb.SEALED,
                    parent_ids=seg.parent_ids,
                    child_ids=seg.child_ids,
                    created_at_epoch=seg.created_at_epoch,
                    sealed_at_epoch=seg.sealed_at_epoch,
                    topic_name=name,
                )
            )
            if seg.is_active:
                try:
                    found = await self.broker.lookup(name)
                    dag.segment_brokers.append(
                        pb.SegmentBrokerAddress(segment_id=seg.segment_id, broker_url=found.broker_url)
                    )
                except DanubeError as exc:
                    log.debug("no owner for %s yet: %s", name, exc)
        return dag


_FORWARDED_KEY = "x-danube-scalable-forwarded"
_FORWARDED_CALL = ((_FORWARDED_KEY, "1"),)


def _forwarded_call(context) -> bool:
    """The call came from another broker's ForwardingSegmentOps (answered here, never forwarded again)."""
    try:
        return any(k == _FORWARDED_KEY for k, _v in (context.invocation_metadata() or ()))
    except Exception:  # noqa: BLE001 - no metadata: a client's call
        return False


CRASH_ENV = "DANUBE_TEST_SCALABLE_CRASH"


def _crash_hook() -> Any:
    """Fault injection for tests only: ``DANUBE_TEST_SCALABLE_CRASH=STEP:FLAGFILE`` makes the first
    broker process of the cluster that reaches split/merge step STEP (controller.STEPS) and creates
    FLAGFILE exit at once (os._exit), as if killed there.  Unset in normal operation."""
    import os

    spec = os.environ.get(CRASH_ENV)
    if not spec or ":" not in spec:
        return None
    step, flag = spec.split(":", 1)

    async def hook(name: str) -> None:
        if name != step:
            return
        try:
            os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # someone crashed here already: this is the leader that completes the operation
        log.error("%s: exiting at split/merge step %s", CRASH_ENV, step)
        os._exit(137)

    return hook


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
            if _forwarded_call(context):
                stats = await BrokerSegmentOps.segment_stats(self.service.ops, request.segment_topic)
            else:
                stats = await self.service.ops.segment_stats(request.segment_topic)
            return pb.JsonResponse(json=json.dumps(stats))
        except DanubeError as exc:
            await _abort(context, exc)
            raise


def add_to_server(server: grpc.aio.Server, broker: BrokerService, **options: Any) -> ScalableTopicService:
    """Registers the scalable topics service on ``server`` (called by danube.server.app)."""
    service = ScalableTopicService(broker, **options)
    pb_grpc.add_ScalableTopicsServicer_to_server(ScalableTopicsServicer(service), server)
    service.start()
    return service


def add_servicer(server: grpc.aio.Server, service: ScalableTopicService) -> None:
    """Serve ``service`` on one more server (the admin port)."""
    pb_grpc.add_ScalableTopicsServicer_to_server(ScalableTopicsServicer(service), server)


def attach(server: grpc.aio.Server, broker: BrokerService, config: Any = None) -> ScalableTopicService | None:
    """The broker app's hook: the service per the ``scalable_topics:`` section (None when disabled)."""
    from danube.routing.scalable.config import ScalableTopicsConfig

    cfg = config if config is not None else ScalableTopicsConfig()
    if not cfg.enabled:
        return None
    return add_to_server(
        server,
        broker,
        grace_seconds=cfg.session_grace_seconds,
        lease_ttl=cfg.controller_lease_seconds,
        auto_split={
            "auto_split_rate": cfg.auto_split_rate,
            "auto_split_interval": cfg.auto_split_interval_seconds,
            "max_segments": cfg.max_segments,
        },
        prune={"prune_interval": cfg.prune_interval_seconds, "sealed_retention": cfg.sealed_retention_seconds},
    )


__all__ = ["ScalableTopicService", "ScalableTopicsServicer", "add_servicer", "add_to_server", "attach"]
