"""The per-topic scalable topic controller (``ScalableTopicController`` of Pulsar PIP-468 scalable topics).

One leader per scalable topic, elected in the metadata store: a transaction "if
``/topics/{ns}/{topic}/controller`` does not exist, put my broker URL there under my lease".
The key disappears with the lease; every candidate watches it and campaigns again.  Every
write the leader makes carries :meth:`guard` (the key still holds this URL under this lease),
so a deposed leader's late writes fail.

Split and merge follow PIP-468's order, with an operation record so a crash at any step is
finished or undone by the next leader:

0. record the operation (``/operation``: parents, children, target layout, step ``create``);
1. discover the parents' subscriptions (segment topics ∪ the subscription records);
2. create the child segment topics with a cursor at Earliest for every subscription;
   then mark the record ``terminate`` — the point of no return;
3. terminate (seal) the parents, one after the other;
4. compare-and-swap the layout to the target, deleting the record in the same transaction;
5. notify the subscription coordinators (rebalance and push assignments).

Recovery by a new leader: a record at step ``create`` is rolled back (children deleted, the
layout never changed, the parents were never sealed); a record at step ``terminate`` is rolled
forward (steps 1-5 again; each is idempotent); a record whose ``fromEpoch`` is no longer the
layout's epoch is stale and dropped.

Pruning (PIP-468's ``pruneSegment``; when is ours, PIP-468 does not say): the leader looks every
``prune_interval`` seconds for SEALED segments that every subscription has drained (terminated,
backlog 0 and nothing unacknowledged on the segment topic, no consumer attached) and whose children
exist, that have stayed so for ``sealed_retention`` seconds (counted by this leader: a new leader
counts afresh), and whose parents are already pruned.  For each, oldest first, under the operation
lock: one transaction compare-and-swaps the layout to ``prune_segment(id)`` and records the
operation (``op: prune`` with the segment topic); the coordinators are notified (the segment
leaves every assignment); the segment topic and its stored data are deleted; the record goes.  A
leader that finds a prune record deletes its segment topic again (idempotent) and drops it.  A
pruned segment topic that a late client made a broker create again is deleted again for a while.

Segment topics are touched only through :class:`SegmentOps` (PIP-468's Segments admin API),
so the controller does not need to own any segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Awaitable, Callable, Mapping, Protocol

from danube._tasks import cancel_and_wait
from danube.errors import DanubeError, InvalidArgumentError, MetadataError, NotFoundError
from danube.metadata import keys
from danube.metadata.store import Compare, Op, dump_json
from danube.model.segment_assignment import ConsumerAssignment
from danube.model.segment_layout import LayoutError, SegmentLayout, segment_topic_name
from danube.routing.scalable.sessions import ConsumerSession, Listener, SubscriptionCoordinator
from danube.routing.scalable.store import ScalableTopicStore

log = logging.getLogger(__name__)

DEFAULT_GRACE_SECONDS = 30.0
STREAM = "stream"  # ordered consumers, assigned segments by the controller
QUEUE = "queue"  # unordered consumers attached to every segment


def segment_sub_type(kind: str) -> str:
    """The ordinary subscription type a scalable subscription uses on each segment topic."""
    return "shared" if kind == QUEUE else "failover"


class NotLeaderError(DanubeError):
    """This broker's controller is not the topic's leader; ``leader_url`` is the one (may be empty)."""

    retriable = True

    def __init__(self, message: str, leader_url: str = "") -> None:
        super().__init__(message)
        self.leader_url = leader_url


class LayoutConflictError(DanubeError):
    """The layout changed under the operation (another leader, another operation in progress)."""

    retriable = True


class SegmentOps(Protocol):
    """Operations on segment topics (ordinary reliable topics), wherever they are owned.

    All are idempotent: creating an existing segment adds the missing subscriptions, terminating
    a terminated one or deleting a missing one succeeds."""

    async def create_segment(self, topic: str, subscriptions: Mapping[str, str]) -> None:
        """Create the segment topic with a cursor at Earliest for each subscription (name → type)."""

    async def terminate_segment(self, topic: str) -> None: ...

    async def delete_segment(self, topic: str) -> None: ...

    async def segment_subscriptions(self, topic: str) -> dict[str, str]:
        """The segment's subscriptions: name → subscription type."""

    async def create_subscription(self, topic: str, subscription: str, sub_type: str) -> None: ...

    async def delete_subscription(self, topic: str, subscription: str) -> None: ...

    async def backlog(self, topic: str, subscription: str) -> int: ...

    async def segment_stats(self, topic: str) -> dict[str, Any]: ...


class LeaseSource(Protocol):
    """The broker's lease (``danube.cluster.membership.Membership`` fits): 0 while it has none."""

    lease_id: int
    fenced: bool


StepHook = Callable[[str], Awaitable[None]]
STEPS = ("intent", "children_created", "terminate_marked", "parents_terminated", "layout_updated")
PRUNE_STEP = "pruned"  # a prune: the layout no longer has the segment, its topic is not deleted yet


async def create_scalable_topic(
    store: ScalableTopicStore,
    ops: SegmentOps,
    topic: str,
    num_segments: int = 1,
    properties: dict[str, str] | None = None,
) -> SegmentLayout:
    """PIP-468's createScalableTopic: write the initial layout, then create its segment topics."""
    keys.split_topic(topic)
    layout = SegmentLayout.initial(num_segments, properties)
    await store.create(topic, layout)
    for seg in layout.active_segments:
        await ops.create_segment(segment_topic_name(topic, seg), {})
    return layout


async def delete_scalable_topic(store: ScalableTopicStore, ops: SegmentOps, topic: str) -> bool:
    """PIP-468's deleteScalableTopic: segment topics first (best effort), then the metadata."""
    stored = await store.load(topic)
    if stored is None:
        return False
    for seg in stored.layout.segments.values():
        try:
            await ops.delete_segment(segment_topic_name(topic, seg))
        except DanubeError as exc:
            log.warning("deleting segment %s of %s: %s", seg.segment_id, topic, exc)
    return await store.delete(topic)


class ScalableTopicController:
    def __init__(
        self,
        topic: str,
        store: ScalableTopicStore,
        ops: SegmentOps,
        lease: LeaseSource,
        broker_url: str,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        step_hook: StepHook | None = None,
        auto_split_rate: float = 0.0,
        auto_split_interval: float = 10.0,
        max_segments: int = 64,
        prune_interval: float = 0.0,
        sealed_retention: float = 3600.0,
    ) -> None:
        keys.split_topic(topic)
        self.topic = topic
        self.store = store
        self.ops = ops
        self.lease = lease
        self.broker_url = broker_url
        self.grace_seconds = grace_seconds
        self._step_hook = step_hook
        self.layout: SegmentLayout | None = None
        self.is_leader = False
        self.leader_url = ""
        self.coordinators: dict[str, SubscriptionCoordinator] = {}
        self.changed = asyncio.Event()  # set on every leadership change
        self._lease_at_election = 0
        self._op_lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._ctl = keys.scalable_controller(topic)
        self.auto_split_rate = auto_split_rate  # msgs/s of one active segment that triggers a split; 0 = off
        self.auto_split_interval = auto_split_interval
        self.max_segments = max_segments
        self._rates: dict[int, tuple[float, int]] = {}  # segment id -> (time, messages_in) last seen
        self._auto_task: asyncio.Task | None = None
        self._op_key = keys.scalable_operation(topic)
        self.prune_interval = prune_interval  # seconds between looks for prunable segments; 0 = never
        self.sealed_retention = sealed_retention  # a drained sealed segment is kept this long
        self._drained_since: dict[int, float] = {}  # segment id -> when this leader first saw it prunable
        self._pruned: dict[str, float] = {}  # segment topic -> when this leader pruned it (watched a while)
        self._prune_task: asyncio.Task | None = None

    # ------------------------------------------------------------ lifecycle and election

    async def start(self) -> None:
        stored = await self.store.require(self.topic)
        self.layout = stored.layout
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"scalable-ctl-{self.topic}")

    async def stop(self, *, resign: bool = True) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await cancel_and_wait(self._auto_task)
        self._auto_task = None
        await cancel_and_wait(self._prune_task)
        self._prune_task = None
        if resign and self.is_leader:
            try:
                await self.store.metadata.txn(self.guard(), [Op.delete(self._ctl)])
            except MetadataError:
                pass
        await self._set_leader("")

    def guard(self) -> list[Compare]:
        return [
            Compare.value(self._ctl, "==", self.broker_url.encode()),
            Compare.lease(self._ctl, "==", self._lease_at_election),
        ]

    async def wait_leader(self, timeout: float = 10.0) -> str:
        """The leader's URL once there is one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.leader_url:
            self.changed.clear()
            async with asyncio.timeout(max(0.0, deadline - loop.time())):  # not wait_for (gh-86296)
                await self.changed.wait()
        return self.leader_url

    async def campaign(self) -> bool:
        lease = self.lease.lease_id
        if not lease or self.lease.fenced:
            return False
        result = await self.store.metadata.txn(
            [Compare.version(self._ctl, "==", 0)],
            [Op.put(self._ctl, self.broker_url.encode(), lease=lease)],
            [Op.get(self._ctl)],
        )
        if result.succeeded:
            self._lease_at_election = lease
            await self._set_leader(self.broker_url)
            return True
        current = result.results[0]
        if current is not None and current.value.decode() == self.broker_url and current.lease == lease:
            self._lease_at_election = lease
            await self._set_leader(self.broker_url)
            return True
        await self._set_leader(current.value.decode() if current is not None else "")
        return False

    async def _run(self) -> None:
        while True:
            try:
                kv, revision = await self.store.metadata.get_with_revision(self._ctl)
                if kv is None:
                    await self.campaign()
                    kv, revision = await self.store.metadata.get_with_revision(self._ctl)
                await self._set_leader(kv.value.decode() if kv is not None else "")
                if self.is_leader and (kv is None or kv.lease != self.lease.lease_id):
                    await self._set_leader("")
                    continue
                async for event in self.store.metadata.watch(self._ctl, start_revision=revision + 1):
                    if event.key != self._ctl:
                        continue
                    if event.kind == "delete":
                        await self._set_leader("")
                        await self.campaign()
                    else:
                        await self._set_leader((event.value or b"").decode())
            except asyncio.CancelledError:
                raise
            except NotFoundError:  # the topic was deleted: leave the election
                log.info("scalable topic %s is gone: %s leaves its election", self.topic, self.broker_url)
                with contextlib.suppress(MetadataError):
                    await self.store.metadata.txn(self.guard(), [Op.delete(self._ctl)])
                self.is_leader, self.leader_url = False, ""
                self.changed.set()
                return
            except Exception as exc:  # noqa: BLE001 - keep campaigning
                log.warning("controller election of %s at %s: %s; retrying", self.topic, self.broker_url, exc)
                if self.is_leader:
                    await self._set_leader("")
                await asyncio.sleep(0.5)

    async def _set_leader(self, url: str) -> None:
        was = self.is_leader
        becoming = bool(url) and url == self.broker_url and self._lease_at_election != 0
        if becoming and not was:
            # recover and restore first: callers see a leader only once it is ready to serve
            log.info("%s is the controller leader of %s", self.broker_url, self.topic)
            await self._on_elected()  # on failure the election loop retries (the key is still ours)
            if self.auto_split_rate > 0 and (self._auto_task is None or self._auto_task.done()):
                self._auto_task = asyncio.get_running_loop().create_task(
                    self._auto_split_loop(), name=f"scalable-autosplit-{self.topic}"
                )
            if self.prune_interval > 0 and (self._prune_task is None or self._prune_task.done()):
                self._prune_task = asyncio.get_running_loop().create_task(
                    self._prune_loop(), name=f"scalable-prune-{self.topic}"
                )
            self._drained_since.clear()  # retention is counted by the leader that prunes
        self.leader_url = url
        self.is_leader = becoming
        self.changed.set()
        if was and not self.is_leader:
            log.warning("%s is no longer the controller leader of %s (now %r)", self.broker_url, self.topic, url)
            for coord in self.coordinators.values():
                coord.close()
            self.coordinators.clear()

    async def _on_elected(self) -> None:
        """Finish or undo an interrupted operation, then restore every consumer session."""
        async with self._op_lock:
            await self._recover()
            stored = await self.store.require(self.topic)
            self.layout = stored.layout
            for coord in self.coordinators.values():
                coord.close()
            self.coordinators = {}
            for sub, doc in (await self.store.subscriptions(self.topic)).items():
                coord = self._coordinator(sub, doc)
                for name, reg in (await self.store.consumers(self.topic, sub)).items():
                    assignment = ConsumerAssignment.from_json(reg) if "assignedSegments" in reg else None
                    coord.restore(name, int(reg.get("consumerId", 0)), assignment)

    def _check_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderError(f"{self.broker_url} is not the controller leader of {self.topic}", self.leader_url)

    async def _step(self, name: str) -> None:
        if self._step_hook is not None:
            await self._step_hook(name)

    # ------------------------------------------------------------ split / merge

    async def split_segment(self, segment_id: int) -> SegmentLayout:
        async with self._op_lock:
            self._check_leader()
            stored = await self.store.require(self.topic)
            target = stored.layout.split_segment(segment_id)
            children = sorted(set(target.segments) - set(stored.layout.segments))
            return await self._operate("split", [segment_id], children, stored.layout, stored.version, target)

    async def merge_segments(self, id1: int, id2: int) -> SegmentLayout:
        async with self._op_lock:
            self._check_leader()
            stored = await self.store.require(self.topic)
            target = stored.layout.merge_segments(id1, id2)
            children = sorted(set(target.segments) - set(stored.layout.segments))
            parents = list(target.segment(children[0]).parent_ids)
            return await self._operate("merge", parents, children, stored.layout, stored.version, target)

    async def _operate(
        self,
        kind: str,
        parents: list[int],
        children: list[int],
        current: SegmentLayout,
        version: int,
        target: SegmentLayout,
    ) -> SegmentLayout:
        record = {
            "op": kind,
            "parentIds": parents,
            "childIds": children,
            "fromEpoch": current.epoch,
            "step": "create",
            "layout": target.to_metadata(),
        }
        result = await self.store.metadata.txn(
            [
                *self.guard(),
                Compare.version(self._op_key, "==", 0),
                Compare.version(keys.scalable_topic(self.topic), "==", version),
            ],
            [Op.put(self._op_key, dump_json(record))],
        )
        if not result.succeeded:
            raise LayoutConflictError(f"{kind} of {self.topic}: the layout changed or an operation is in progress")
        await self._step("intent")
        return await self._roll_forward(record, version)

    async def _roll_forward(self, record: dict, layout_version: int) -> SegmentLayout:
        target = SegmentLayout.from_metadata(record["layout"])
        current = (await self.store.require(self.topic)).layout
        parents = [current.segment(p) for p in record["parentIds"]]
        # 1. discover subscriptions (the parents' union, and every subscription record)
        subs: dict[str, str] = {}
        for p in parents:
            subs.update(await self.ops.segment_subscriptions(segment_topic_name(self.topic, p)))
        for name, doc in (await self.store.subscriptions(self.topic)).items():
            subs.setdefault(name, segment_sub_type(doc.get("type", STREAM)))
        # 2. create the children with every cursor
        for cid in record["childIds"]:
            await self.ops.create_segment(segment_topic_name(self.topic, target.segment(cid)), subs)
        await self._step("children_created")
        if record["step"] != "terminate":
            record = {**record, "step": "terminate"}
            result = await self.store.metadata.txn(
                [*self.guard(), Compare.version(self._op_key, ">", 0)], [Op.put(self._op_key, dump_json(record))]
            )
            if not result.succeeded:
                raise NotLeaderError(f"lost the controller leadership of {self.topic} during a {record['op']}")
        await self._step("terminate_marked")
        # 3. terminate the parents, one after the other
        for p in parents:
            await self.ops.terminate_segment(segment_topic_name(self.topic, p))
        await self._step("parents_terminated")
        # 4. compare-and-swap the layout, dropping the record in the same transaction
        ok = await self.store.cas_layout(
            self.topic,
            layout_version,
            target,
            compare=[*self.guard(), Compare.version(self._op_key, ">", 0)],
            ops=[Op.delete(self._op_key)],
        )
        if not ok:
            raise LayoutConflictError(f"{record['op']} of {self.topic}: the layout CAS failed")
        await self._step("layout_updated")
        log.info(
            "%s of %s: segments %s sealed, %s active (epoch %d)",
            record["op"],
            self.topic,
            record["parentIds"],
            record["childIds"],
            target.epoch,
        )
        # 5. notify
        self.layout = target
        await self._notify(target)
        return target

    async def _recover(self) -> None:
        found = await self.store.load_operation(self.topic)
        if found is None:
            return
        record, _ = found
        if record.get("op") == "prune":  # the layout no longer has it: finish deleting its topic
            log.warning("completing the interrupted prune of %s (segment %s)", self.topic, record.get("segmentId"))
            await self._finish_prune(record)
            return
        stored = await self.store.require(self.topic)
        if stored.layout.epoch != record.get("fromEpoch"):
            log.info("dropping the stale %s record of %s", record.get("op"), self.topic)
            await self.store.metadata.txn(self.guard(), [Op.delete(self._op_key)])
            return
        if record.get("step") == "terminate":
            log.warning(
                "completing the interrupted %s of %s (parents %s)", record["op"], self.topic, record["parentIds"]
            )
            await self._roll_forward(record, stored.version)
            return
        log.warning("rolling back the interrupted %s of %s (children %s)", record["op"], self.topic, record["childIds"])
        target = SegmentLayout.from_metadata(record["layout"])
        for cid in record["childIds"]:
            await self.ops.delete_segment(segment_topic_name(self.topic, target.segment(cid)))
        await self.store.metadata.txn(self.guard(), [Op.delete(self._op_key)])

    async def _notify(self, layout: SegmentLayout) -> None:
        for coord in list(self.coordinators.values()):
            await coord.on_layout_change(layout)

    # ------------------------------------------------------------ pruning sealed segments

    async def _prune_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.is_leader:
            await asyncio.sleep(self.prune_interval)
            try:
                await self.prune_tick(loop.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next time
                log.warning("pruning sealed segments of %s: %s", self.topic, exc)

    async def _drained_by_all(self, layout: SegmentLayout, segment_id: int) -> bool:
        """Nobody needs the sealed segment any more: children present, and on its topic: terminated,
        every subscription's backlog 0 and nothing unacknowledged, no consumer attached.  (Whether
        its parents are pruned is the caller's check: the retention clock runs regardless.)"""
        seg = layout.segment(segment_id)
        if seg.is_active or not seg.child_ids or any(c not in layout.segments for c in seg.child_ids):
            return False
        try:
            stats = await self.ops.segment_stats(segment_topic_name(self.topic, seg))
        except DanubeError as exc:
            log.debug("segment %d of %s: no stats (%s); not pruned now", segment_id, self.topic, exc)
            return False
        subs = stats.get("subscriptions")
        if not stats.get("terminated") or not isinstance(subs, dict) or int(stats.get("consumers", 0)):
            return False
        return all(
            int(s.get("backlog", 1)) == 0 and int(s.get("unacked", 0)) == 0 and not int(s.get("consumers", 0))
            for s in subs.values()
        )

    async def prune_tick(self, now: float) -> list[int]:
        """Prune every sealed segment that may go (module docstring), oldest first; their ids."""
        if not self.is_leader:
            return []
        pruned: list[int] = []
        async with self._op_lock:
            self._check_leader()
            await self._delete_revived(now)
            stored = await self.store.require(self.topic)
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
                record = {
                    "op": "prune",
                    "segmentId": sid,
                    "segmentTopic": segment_topic_name(self.topic, seg),
                    "fromEpoch": target.epoch,
                }
                ok = await self.store.cas_layout(
                    self.topic,
                    version,
                    target,
                    compare=[*self.guard(), Compare.version(self._op_key, "==", 0)],
                    ops=[Op.put(self._op_key, dump_json(record))],
                )
                if not ok:
                    raise LayoutConflictError(f"prune of segment {sid} of {self.topic}: the layout changed")
                await self._step(PRUNE_STEP)
                log.info(
                    "segment %d of %s pruned (drained by every subscription for %.0f s; epoch %d)",
                    sid,
                    self.topic,
                    now - since,
                    target.epoch,
                )
                self._drained_since.pop(sid, None)
                self._pruned[record["segmentTopic"]] = now
                layout = target
                self.layout = target
                await self._notify(target)
                await self._finish_prune(record)
                version = (await self.store.require(self.topic)).version
                pruned.append(sid)
        return pruned

    async def _delete_revived(self, now: float) -> None:
        """A client that attached to a segment just as it was pruned (its layout not yet updated)
        makes its broker create the segment topic anew; segment ids are never reused, so such a
        topic is an orphan: deleted again while this leader watches recent prunes."""
        watch_for = max(300.0, 10 * self.prune_interval)
        for name, when in list(self._pruned.items()):
            if now - when > watch_for:
                del self._pruned[name]
            elif await self.store.metadata.get(keys.topic_delivery(name)) is not None:
                log.warning("pruned segment topic %s was created again (a late client); deleting it", name)
                try:
                    await self.ops.delete_segment(name)
                except DanubeError as exc:  # the next look tries again; pruning goes on meanwhile
                    log.warning("deleting the revived segment topic %s: %s", name, exc)

    async def _finish_prune(self, record: dict) -> None:
        """Delete the pruned segment's topic and data, then the record (each step idempotent)."""
        await self.ops.delete_segment(str(record["segmentTopic"]))
        result = await self.store.metadata.txn(self.guard(), [Op.delete(self._op_key)])
        if not result.succeeded:
            raise NotLeaderError(f"lost the controller leadership of {self.topic} during a prune", self.leader_url)

    # ------------------------------------------------------------ automatic splitting (optional)

    async def _auto_split_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self.is_leader:
            await asyncio.sleep(self.auto_split_interval)
            try:
                await self.auto_split_tick(loop.time())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - try again next tick
                log.warning("automatic split check of %s: %s", self.topic, exc)

    async def auto_split_tick(self, now: float) -> int | None:
        """Split the busiest active segment whose publish rate since the last tick exceeds
        ``auto_split_rate`` (at most one split a tick, up to ``max_segments``); its id, or None."""
        if not self.is_leader or self.auto_split_rate <= 0 or self.layout is None:
            return None
        active = self.layout.active_segments
        busiest: tuple[float, int] | None = None
        for seg in active:
            stats = await self.ops.segment_stats(segment_topic_name(self.topic, seg))
            count = int(stats.get("messages_in", 0))
            seen = self._rates.get(seg.segment_id)
            self._rates[seg.segment_id] = (now, count)
            if seen is None or count < seen[1] or now <= seen[0]:
                continue  # first sight, or the counter restarted (the segment moved)
            rate = (count - seen[1]) / (now - seen[0])
            if rate > self.auto_split_rate and seg.hash_range.size > 1 and (busiest is None or rate > busiest[0]):
                busiest = (rate, seg.segment_id)
        if busiest is None or len(active) >= self.max_segments:
            return None
        log.info(
            "automatic split of segment %d of %s: %.0f msg/s > %.0f",
            busiest[1],
            self.topic,
            busiest[0],
            self.auto_split_rate,
        )
        await self.split_segment(busiest[1])
        return busiest[1]

    # ------------------------------------------------------------ subscriptions and consumers

    def _coordinator(self, sub: str, doc: dict) -> SubscriptionCoordinator:
        assert self.layout is not None
        coord = SubscriptionCoordinator(
            self.topic,
            sub,
            self.layout,
            persist=self._persister(sub),
            grace_seconds=self.grace_seconds,
            drained=doc.get("drainedSegments", ()),
        )
        self.coordinators[sub] = coord
        return coord

    def _persister(self, sub: str) -> Callable[[str, ConsumerSession | None], Awaitable[None]]:
        async def persist(name: str, session: ConsumerSession | None) -> None:
            if session is None:
                ok = await self.store.delete_consumer(self.topic, sub, name, compare=self.guard())
            else:
                doc = {
                    "consumerName": name,
                    "consumerId": session.consumer_id,
                    **(session.assignment.to_json() if session.assignment else {}),
                }
                ok = await self.store.put_consumer(self.topic, sub, name, doc, compare=self.guard())
            if not ok:
                raise NotLeaderError(f"lost the controller leadership of {self.topic}", self.leader_url)

        return persist

    async def create_subscription(self, sub: str, kind: str = STREAM) -> bool:
        """Create ``sub`` (``stream``: ordered consumers; ``queue``) on every active segment; sealed
        history counts as consumed for it."""
        keys.check_name("subscription", sub)
        if kind not in (STREAM, QUEUE):
            raise InvalidArgumentError(f"a scalable subscription is {STREAM!r} or {QUEUE!r}, not {kind!r}")
        async with self._op_lock:
            self._check_leader()
            return await self._create_subscription(sub, kind)

    async def _create_subscription(self, sub: str, kind: str = STREAM) -> bool:
        layout = (await self.store.require(self.topic)).layout
        for seg in layout.active_segments:
            await self.ops.create_subscription(segment_topic_name(self.topic, seg), sub, segment_sub_type(kind))
        doc = {
            "subscription": sub,
            "type": kind,
            "drainedSegments": sorted(s for s, i in layout.segments.items() if not i.is_active),
        }
        created = await self.store.put_subscription(self.topic, sub, doc)
        if sub not in self.coordinators:
            self._coordinator(sub, doc if created else (await self.store.subscriptions(self.topic)).get(sub, doc))
        return created

    async def delete_subscription(self, sub: str) -> bool:
        async with self._op_lock:
            self._check_leader()
            coord = self.coordinators.pop(sub, None)
            if coord is not None:
                coord.close()
            layout = (await self.store.require(self.topic)).layout
            for seg in layout.segments.values():
                await self.ops.delete_subscription(segment_topic_name(self.topic, seg), sub)
            return await self.store.delete_subscription(self.topic, sub)

    async def register_consumer(
        self, sub: str, name: str, consumer_id: int = 0, listener: Listener | None = None
    ) -> ConsumerAssignment:
        """PIP-468's registerConsumer (ordered consumers): the consumer's segment assignment."""
        keys.check_name("consumer", name)
        self._check_leader()
        if sub not in self.coordinators:
            async with self._op_lock:
                self._check_leader()
                if sub not in self.coordinators:
                    await self._create_subscription(sub)
        return await self.coordinators[sub].add_consumer(name, consumer_id, listener)

    def consumer_disconnected(self, sub: str, name: str) -> None:
        coord = self.coordinators.get(sub)
        if coord is not None:
            coord.disconnected(name)

    async def unregister_consumer(self, sub: str, name: str) -> None:
        self._check_leader()
        coord = self.coordinators.get(sub)
        if coord is not None:
            await coord.remove_consumer(name)

    async def segment_drained(self, sub: str, segment_id: int) -> bool:
        """``sub`` consumed the sealed segment whole: its children may be delivered (after a check)."""
        self._check_leader()
        coord = self.coordinators.get(sub)
        if coord is None:
            raise InvalidArgumentError(f"subscription {sub} of {self.topic} has no ordered consumers")
        assert self.layout is not None
        seg = self.layout.segment(segment_id)
        if seg.is_active:
            raise LayoutError(f"segment {segment_id} is active: it cannot be drained")
        backlog = await self.ops.backlog(segment_topic_name(self.topic, seg), sub)
        if backlog:
            raise InvalidArgumentError(f"segment {segment_id} still has {backlog} unacknowledged messages for {sub}")
        if segment_id in coord.drained:
            return False
        key = keys.scalable_subscription(self.topic, sub)
        kv = await self.store.metadata.get(key)
        doc = json.loads(kv.value) if kv is not None else {"subscription": sub}
        doc["drainedSegments"] = sorted(set(doc.get("drainedSegments", ())) | {segment_id})
        result = await self.store.metadata.txn(
            [*self.guard(), Compare.version(key, "==", kv.version if kv else 0)], [Op.put(key, dump_json(doc))]
        )
        if not result.succeeded:
            raise LayoutConflictError(f"subscription {sub} of {self.topic} changed concurrently; retry")
        return await coord.segment_drained(segment_id)
