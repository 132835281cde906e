"""Pruning a scalable topic's sealed segments (PIP-468's ``pruneSegment``; when is ours, PIP-468
does not say), done by the topic's controller leader.

Every ``prune_interval`` seconds the leader looks for SEALED segments that every subscription has
drained (terminated, backlog 0 and nothing unacknowledged on the segment topic, no consumer
attached) and whose children exist, that have stayed so for ``sealed_retention`` seconds (counted
by this leader: a new leader counts afresh), and whose parents are already pruned.  For each,
oldest first, under the operation lock: one transaction compare-and-swaps the layout to
``prune_segment(id)`` and records the operation (``op: prune`` with the segment topic); the
coordinators are notified (the segment leaves every assignment); the segment topic and its stored
data are deleted; the record goes.  A leader that finds a prune record deletes its segment topic
again (idempotent) and drops it.  A pruned segment topic that a late client made a broker create
again is deleted again for a while.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from danube.errors import DanubeError
from danube.metadata import keys
from danube.metadata.store import Compare, Op, dump_json
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.routing.scalable.contracts import PRUNE_STEP, LayoutConflictError, NotLeaderError
from danube.routing.scalable.leader_ticker import LeaderTicker

if TYPE_CHECKING:
    from danube.routing.scalable.controller import ScalableTopicController

log = logging.getLogger(__name__)


class SegmentPruner(LeaderTicker):
    """The pruning of one controller's topic (acts only while the controller leads)."""

    what = "pruning sealed segments"

    def __init__(self, ctl: ScalableTopicController, *, prune_interval: float, sealed_retention: float) -> None:
        super().__init__(ctl, prune_interval)  # seconds between looks for prunable segments; 0 = never
        self.sealed_retention = sealed_retention  # a drained sealed segment is kept this long
        self._drained_since: dict[int, float] = {}  # segment id -> when this leader first saw it prunable
        self._pruned: dict[str, float] = {}  # segment topic -> when this leader pruned it (watched a while)

    def elected(self) -> None:
        """The controller became the leader: look periodically (when configured), count afresh."""
        self.start_ticking()
        self._drained_since.clear()  # retention is counted by the leader that prunes

    async def _drained_by_all(self, layout: SegmentLayout, segment_id: int) -> bool:
        """Nobody needs the sealed segment any more: children present, and on its topic: terminated,
        every subscription's backlog 0 and nothing unacknowledged, no consumer attached.  (Whether
        its parents are pruned is the caller's check: the retention clock runs regardless.)"""
        seg = layout.segment(segment_id)
        if seg.is_active or not seg.child_ids or any(c not in layout.segments for c in seg.child_ids):
            return False
        try:
            stats = await self.ctl.ops.segment_stats(segment_topic_name(self.ctl.topic, seg))
        except DanubeError as exc:
            log.debug("segment %d of %s: no stats (%s); not pruned now", segment_id, self.ctl.topic, exc)
            return False
        subs = stats.get("subscriptions")
        if not stats.get("terminated") or not isinstance(subs, dict) or int(stats.get("consumers", 0)):
            return False
        return all(
            int(s.get("backlog", 1)) == 0 and int(s.get("unacked", 0)) == 0 and not int(s.get("consumers", 0))
            for s in subs.values()
        )

    async def tick(self, now: float) -> list[int]:
        """Prune every sealed segment that may go (module docstring), oldest first; their ids."""
        ctl = self.ctl
        if not ctl.is_leader:
            return []
        pruned: list[int] = []
        async with ctl.op_lock:
            ctl.check_leader()
            await self._delete_revived(now)
            stored = await ctl.store.require(ctl.topic)
            layout, version = stored.layout, stored.version
            sealed = sorted(
                (s for s in layout.segments.values() if not s.is_active),
                key=lambda s: (s.sealed_at_epoch, s.segment_id),
            )
            for seg in sealed:
                sid = seg.segment_id
                if not await self._drained_by_all(layout, sid):
                    self._drained_since.pop(sid, None)
                    continue
                since = self._drained_since.setdefault(sid, now)
                if now - since < self.sealed_retention or any(p in layout.segments for p in seg.parent_ids):
                    continue  # kept for the retention; or its parents go first (maybe in this look)
                target = layout.prune_segment(sid)
                segment_topic = segment_topic_name(ctl.topic, seg)
                record = {"op": "prune", "segmentId": sid, "segmentTopic": segment_topic, "fromEpoch": target.epoch}
                ok = await ctl.store.cas_layout(
                    ctl.topic,
                    version,
                    target,
                    compare=[*ctl.guard(), Compare.version(ctl.op_key, "==", 0)],
                    ops=[Op.put(ctl.op_key, dump_json(record))],
                )
                if not ok:
                    raise LayoutConflictError(f"prune of segment {sid} of {ctl.topic}: the layout changed")
                await ctl.step(PRUNE_STEP)
                log.info(
                    "segment %d of %s pruned (drained by every subscription for %.0f s; epoch %d)",
                    sid,
                    ctl.topic,
                    now - since,
                    target.epoch,
                )
                self._drained_since.pop(sid, None)
                self._pruned[segment_topic] = now
                layout = target
                ctl.layout = target
                await ctl.subscriptions.notify(target)
                await self.finish(record)
                version = (await ctl.store.require(ctl.topic)).version
                pruned.append(sid)
        return pruned

    async def _delete_revived(self, now: float) -> None:
        """A client that attached to a segment just as it was pruned (its layout not yet updated)
        makes its broker create the segment topic anew; segment ids are never reused, so such a
        topic is an orphan: deleted again while this leader watches recent prunes."""
        watch_for = max(300.0, 10 * self.interval)
        for name, when in list(self._pruned.items()):
            if now - when > watch_for:
                del self._pruned[name]
            elif await self.ctl.store.metadata.get(keys.topic_delivery(name)) is not None:
                log.warning("pruned segment topic %s was created again (a late client); deleting it", name)
                try:
                    await self.ctl.ops.delete_segment(name)
                except DanubeError as exc:  # the next look tries again; pruning goes on meanwhile
                    log.warning("deleting the revived segment topic %s: %s", name, exc)

    async def finish(self, record: dict) -> None:
        """Delete the pruned segment's topic and data, then the record (each step idempotent)."""
        ctl = self.ctl
        await ctl.ops.delete_segment(str(record["segmentTopic"]))
        result = await ctl.store.metadata.txn(ctl.guard(), [Op.delete(ctl.op_key)])
        if not result.succeeded:
            raise NotLeaderError(f"lost the controller leadership of {ctl.topic} during a prune", ctl.leader_url)
