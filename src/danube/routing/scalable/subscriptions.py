"""A scalable topic's subscriptions as its controller leader keeps them: one
:class:`~danube.routing.scalable.sessions.SubscriptionCoordinator` per subscription (ordered
consumers' segment assignments, persisted under the leader's guard), the subscription records, the
subscription on every segment topic, and the drained sealed segments each subscription reported.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Awaitable, Callable

from danube.errors import InvalidArgumentError
from danube.metadata import keys
from danube.metadata.store import Compare, Op, dump_json
from danube.model.segment_assignment import ConsumerAssignment
from danube.model.segment_layout import LayoutError, SegmentLayout, segment_topic_name
from danube.routing.scalable.contracts import (
    QUEUE,
    STREAM,
    LayoutConflictError,
    NotLeaderError,
    segment_sub_type,
)
from danube.routing.scalable.sessions import ConsumerSession, Listener, SubscriptionCoordinator

if TYPE_CHECKING:
    from danube.routing.scalable.controller import ScalableTopicController


class ScalableSubscriptions:
    """The subscriptions of one controller's topic; every call but :meth:`consumer_disconnected`
    needs the controller to lead."""

    def __init__(self, ctl: ScalableTopicController, *, grace_seconds: float) -> None:
        self.ctl = ctl
        self.grace_seconds = grace_seconds
        self.coordinators: dict[str, SubscriptionCoordinator] = {}

    async def restore(self) -> None:
        """The controller was elected: every consumer session back from the store (under the
        operation lock, with the controller's layout current)."""
        ctl = self.ctl
        self.close_all()
        for sub, doc in (await ctl.store.subscriptions(ctl.topic)).items():
            coord = self._coordinator(sub, doc)
            for name, reg in (await ctl.store.consumers(ctl.topic, sub)).items():
                assignment = ConsumerAssignment.from_json(reg) if "assignedSegments" in reg else None
                coord.restore(name, int(reg.get("consumerId", 0)), assignment)

    def close_all(self) -> None:
        for coord in self.coordinators.values():
            coord.close()
        self.coordinators = {}

    async def notify(self, layout: SegmentLayout) -> None:
        """The layout changed: every coordinator rebalances and pushes assignments."""
        for coord in list(self.coordinators.values()):
            await coord.on_layout_change(layout)

    def _coordinator(self, sub: str, doc: dict) -> SubscriptionCoordinator:
        assert self.ctl.layout is not None
        coord = SubscriptionCoordinator(
            self.ctl.topic,
            sub,
            self.ctl.layout,
            persist=self._persister(sub),
            grace_seconds=self.grace_seconds,
            drained=doc.get("drainedSegments", ()),
        )
        self.coordinators[sub] = coord
        return coord

    def _persister(self, sub: str) -> Callable[[str, ConsumerSession | None], Awaitable[None]]:
        ctl = self.ctl

        async def persist(name: str, session: ConsumerSession | None) -> None:
            if session is None:
                ok = await ctl.store.delete_consumer(ctl.topic, sub, name, compare=ctl.guard())
            else:
                doc = {
                    "consumerName": name,
                    "consumerId": session.consumer_id,
                    **(session.assignment.to_json() if session.assignment else {}),
                }
                ok = await ctl.store.put_consumer(ctl.topic, sub, name, doc, compare=ctl.guard())
            if not ok:
                raise NotLeaderError(f"lost the controller leadership of {ctl.topic}", ctl.leader_url)

        return persist

    async def create(self, sub: str, kind: str = STREAM) -> bool:
        """Create ``sub`` (``stream``: ordered consumers; ``queue``) on every active segment; sealed
        history counts as consumed for it."""
        keys.check_name("subscription", sub)
        if kind not in (STREAM, QUEUE):
            raise InvalidArgumentError(f"a scalable subscription is {STREAM!r} or {QUEUE!r}, not {kind!r}")
        async with self.ctl.op_lock:
            self.ctl.check_leader()
            return await self._create(sub, kind)

    async def _create(self, sub: str, kind: str = STREAM) -> bool:
        ctl = self.ctl
        layout = (await ctl.store.require(ctl.topic)).layout
        for seg in layout.active_segments:
            await ctl.ops.create_subscription(segment_topic_name(ctl.topic, seg), sub, segment_sub_type(kind))
        doc = {
            "subscription": sub,
            "type": kind,
            "drainedSegments": sorted(s for s, i in layout.segments.items() if not i.is_active),
        }
        created = await ctl.store.put_subscription(ctl.topic, sub, doc)
        if sub not in self.coordinators:
            self._coordinator(sub, doc if created else (await ctl.store.subscriptions(ctl.topic)).get(sub, doc))
        return created

    async def delete(self, sub: str) -> bool:
        ctl = self.ctl
        async with ctl.op_lock:
            ctl.check_leader()
            coord = self.coordinators.pop(sub, None)
            if coord is not None:
                coord.close()
            layout = (await ctl.store.require(ctl.topic)).layout
            for seg in layout.segments.values():
                await ctl.ops.delete_subscription(segment_topic_name(ctl.topic, seg), sub)
            return await ctl.store.delete_subscription(ctl.topic, sub)

    async def register_consumer(
        self, sub: str, name: str, consumer_id: int = 0, listener: Listener | None = None
    ) -> ConsumerAssignment:
        """PIP-468's registerConsumer (ordered consumers): the consumer's segment assignment."""
        keys.check_name("consumer", name)
        self.ctl.check_leader()
        if sub not in self.coordinators:
            async with self.ctl.op_lock:
                self.ctl.check_leader()
                if sub not in self.coordinators:
                    await self._create(sub)
        return await self.coordinators[sub].add_consumer(name, consumer_id, listener)

    def consumer_disconnected(self, sub: str, name: str) -> None:
        coord = self.coordinators.get(sub)
        if coord is not None:
            coord.disconnected(name)

    async def unregister_consumer(self, sub: str, name: str) -> None:
        self.ctl.check_leader()
        coord = self.coordinators.get(sub)
        if coord is not None:
            await coord.remove_consumer(name)

    async def segment_drained(self, sub: str, segment_id: int) -> bool:
        """``sub`` consumed the sealed segment whole: its children may be delivered (after a check)."""
        ctl = self.ctl
        ctl.check_leader()
        coord = self.coordinators.get(sub)
        if coord is None:
            raise InvalidArgumentError(f"subscription {sub} of {ctl.topic} has no ordered consumers")
        assert ctl.layout is not None
        seg = ctl.layout.segment(segment_id)
        if seg.is_active:
            raise LayoutError(f"segment {segment_id} is active: it cannot be drained")
        backlog = await ctl.ops.backlog(segment_topic_name(ctl.topic, seg), sub)
        if backlog:
            raise InvalidArgumentError(f"segment {segment_id} still has {backlog} unacknowledged messages for {sub}")
        if segment_id in coord.drained:
            return False
        key = keys.scalable_subscription(ctl.topic, sub)
        kv = await ctl.store.metadata.get(key)
        doc = json.loads(kv.value) if kv is not None else {"subscription": sub}
        doc["drainedSegments"] = sorted(set(doc.get("drainedSegments", ())) | {segment_id})
        result = await ctl.store.metadata.txn(
            [*ctl.guard(), Compare.version(key, "==", kv.version if kv else 0)], [Op.put(key, dump_json(doc))]
        )
        if not result.succeeded:
            raise LayoutConflictError(f"subscription {sub} of {ctl.topic} changed concurrently; retry")
        return await coord.segment_drained(segment_id)
