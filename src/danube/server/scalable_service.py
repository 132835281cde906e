"""Scalable topics on a broker (proto/danube_scalable/scalable.proto; docs/scalable-topics.md).

:class:`ScalableTopicService` is PIP-468's per-broker singleton: it keeps one
:class:`~danube.routing.scalable.controller.ScalableTopicController` per scalable topic this
broker was asked about (each takes part in that topic's election), serves DAG watch sessions
from the metadata store, and forwards what only the controller leader may do (split, merge,
subscriptions; consumer registration answers NotLeaderError with the leader's URL) to the
leader over this same service.  Segment operations go to the broker serving the segment
(``scalable_forwarding``); the gRPC servicer is ``scalable_servicer``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

import grpc

from danube.cluster import peers
from danube.errors import DanubeError
from danube.metadata.election import LeaseHolder
from danube.metadata.lease import LeaseKeeper
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.routing.scalable.contracts import DEFAULT_GRACE_SECONDS, STREAM, StepHook
from danube.routing.scalable.controller import (
    ScalableTopicController,
    create_scalable_topic,
    delete_scalable_topic,
)
from danube.routing.scalable.store import ScalableTopicStore, TopicSnapshot
from danube.server.scalable_forwarding import ForwardingSegmentOps
from danube.server.scalable_servicer import ScalableTopicsServicer

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)


class ScalableTopicService:
    def __init__(
        self,
        broker: BrokerService,
        *,
        broker_url: str | None = None,
        lease: LeaseHolder | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        lease_ttl: int = 10,
        auto_split: dict[str, Any] | None = None,
        prune: dict[str, Any] | None = None,
        step_hook: StepHook | None = None,
    ) -> None:
        """``lease``: what the controllers campaign with (default: the cluster membership's lease, or
        on a standalone broker a lease of the service's own of ``lease_ttl`` seconds).
        ``step_hook``: awaited at each split, merge and prune step (fault-injection tests)."""
        self.broker = broker
        self.metadata = broker.metadata
        self.broker_url = broker_url or broker.broker_url
        self.store = ScalableTopicStore(self.metadata)
        self.ops = ForwardingSegmentOps(broker, self.remote)
        self.grace_seconds = grace_seconds
        self._lease = lease
        self._own_lease: LeaseKeeper | None = None
        self._step_hook = step_hook
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

    async def _lease_source(self) -> LeaseHolder:
        if self._lease is None:
            cluster = self.broker.cluster
            if cluster is not None:
                self._lease = cluster.membership
            else:
                own = LeaseKeeper(self.metadata, lease_ttl_s=self.lease_ttl, name="scalable topics")
                await own.acquire()
                own.start()
                self._own_lease = self._lease = own
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
                        step_hook=self._step_hook,
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


def add_to_server(server: grpc.aio.Server, broker: BrokerService, **options: Any) -> ScalableTopicService:
    """Registers the scalable topics service on ``server`` (called by danube.server.app)."""
    service = ScalableTopicService(broker, **options)
    pb_grpc.add_ScalableTopicsServicer_to_server(ScalableTopicsServicer(service), server)
    service.start()
    return service


def add_servicer(server: grpc.aio.Server, service: ScalableTopicService) -> None:
    """Serve ``service`` on one more server (the admin port)."""
    pb_grpc.add_ScalableTopicsServicer_to_server(ScalableTopicsServicer(service), server)


def attach(
    server: grpc.aio.Server, broker: BrokerService, config: ScalableTopicsConfig | None = None
) -> ScalableTopicService | None:
    """The broker app's hook: the service per the ``scalable_topics:`` section (None when disabled)."""
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
        step_hook=cfg.load_step_hook(),
    )


__all__ = ["ScalableTopicService", "ScalableTopicsServicer", "add_servicer", "add_to_server", "attach"]
