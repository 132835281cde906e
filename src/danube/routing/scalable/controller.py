"""The per-topic scalable topic controller (``ScalableTopicController`` of Pulsar PIP-468 scalable topics):
its election, and split and merge with their operation record.

One leader per scalable topic, elected in the metadata store (``danube.metadata.election``,
the project's one election): key ``/topics/{ns}/{topic}/controller``, the candidate's broker URL
written under its lease.  Every write the leader makes carries :meth:`ScalableTopicController.guard`,
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
layout's epoch is stale and dropped; a prune record is completed (``pruning``).

The leader's other jobs live beside it: pruning sealed segments (``pruning``), automatic splits
(``autosplit``), subscriptions and consumer sessions (``subscriptions``).  Segment topics are
touched only through :class:`SegmentOps` (PIP-468's Segments admin API), so the controller does
not need to own any segment.
"""

from __future__ import annotations

import asyncio
import logging

from danube.errors import DanubeError, NotFoundError
from danube.metadata import keys
from danube.metadata.election import Election, LeaseHolder
from danube.metadata.store import Compare, Op, dump_json
from danube.model.segment_assignment import ConsumerAssignment
from danube.model.segment_layout import SegmentLayout, segment_topic_name
from danube.routing.scalable.autosplit import AutoSplitter
from danube.routing.scalable.contracts import (
    DEFAULT_GRACE_SECONDS,
    PRUNE_STEP,
    QUEUE,
    STEPS,
    STREAM,
    LayoutConflictError,
    NotLeaderError,
    SegmentOps,
    StepHook,
    segment_sub_type,
)
from danube.routing.scalable.pruning import SegmentPruner
from danube.routing.scalable.sessions import Listener, SubscriptionCoordinator
from danube.routing.scalable.store import ScalableTopicStore
from danube.routing.scalable.subscriptions import ScalableSubscriptions

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "PRUNE_STEP",
    "QUEUE",
    "STEPS",
    "STREAM",
    "LayoutConflictError",
    "NotLeaderError",
    "ScalableTopicController",
    "SegmentOps",
    "StepHook",
    "create_scalable_topic",
    "delete_scalable_topic",
    "segment_sub_type",
]


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
    """One broker's part in one scalable topic: a candidate in its election and, while leading,
    the only one that changes its layout, prunes it and keeps its subscriptions (module docstring)."""

    def __init__(
        self,
        topic: str,
        store: ScalableTopicStore,
        ops: SegmentOps,
        lease: LeaseHolder,
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
        self._step_hook = step_hook
        self.layout: SegmentLayout | None = None
        self.op_lock = asyncio.Lock()  # one split, merge, prune or subscription change at a time
        self.op_key = keys.scalable_operation(topic)
        self.election = Election(
            store.metadata,
            keys.scalable_controller(topic),
            broker_url,
            lease,
            what=f"the controller of {topic}",
            on_elected=self._elected,
            on_deposed=self._deposed,
            ends_on=(NotFoundError,),  # the topic was deleted: leave its election
        )
        self.subscriptions = ScalableSubscriptions(self, grace_seconds=grace_seconds)
        self.pruner = SegmentPruner(self, prune_interval=prune_interval, sealed_retention=sealed_retention)
        self.auto_splitter = AutoSplitter(
            self, auto_split_rate=auto_split_rate, auto_split_interval=auto_split_interval, max_segments=max_segments
        )

    # ------------------------------------------------------------ lifecycle and election

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    @property
    def leader_url(self) -> str:
        return self.election.leader

    @property
    def changed(self) -> asyncio.Event:
        """Set on every leadership change."""
        return self.election.changed

    @property
    def coordinators(self) -> dict[str, SubscriptionCoordinator]:
        return self.subscriptions.coordinators

    async def start(self) -> None:
        stored = await self.store.require(self.topic)
        self.layout = stored.layout
        self.election.start()

    async def stop(self, *, resign: bool = True) -> None:
        await self.auto_splitter.stop()
        await self.pruner.stop()
        await self.election.stop(resign=resign)

    def guard(self) -> list[Compare]:
        return self.election.guard()

    async def wait_leader(self, timeout: float = 10.0) -> str:
        """The leader's URL once there is one."""
        return await self.election.wait_leader(timeout)

    async def campaign(self) -> bool:
        return await self.election.campaign()

    async def _elected(self) -> None:
        """Finish or undo an interrupted operation, restore every consumer session, start the periodic
        jobs; the election publishes this leader only after it (on failure it retries: the key is
        still ours)."""
        async with self.op_lock:
            await self._recover()
            stored = await self.store.require(self.topic)
            self.layout = stored.layout
            await self.subscriptions.restore()
        self.auto_splitter.elected()
        self.pruner.elected()

    async def _deposed(self) -> None:
        self.subscriptions.close_all()

    def check_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderError(f"{self.broker_url} is not the controller leader of {self.topic}", self.leader_url)

    async def step(self, name: str) -> None:
        """A split, merge or prune passed step ``name`` (the step hook's place)."""
        if self._step_hook is not None:
            await self._step_hook(name)

    # ------------------------------------------------------------ split / merge

    async def split_segment(self, segment_id: int) -> SegmentLayout:
        async with self.op_lock:
            self.check_leader()
            stored = await self.store.require(self.topic)
            target = stored.layout.split_segment(segment_id)
            children = sorted(set(target.segments) - set(stored.layout.segments))
            return await self._operate("split", [segment_id], children, stored.layout, stored.version, target)

    async def merge_segments(self, id1: int, id2: int) -> SegmentLayout:
        async with self.op_lock:
            self.check_leader()
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
                Compare.version(self.op_key, "==", 0),
                Compare.version(keys.scalable_topic(self.topic), "==", version),
            ],
            [Op.put(self.op_key, dump_json(record))],
        )
        if not result.succeeded:
            raise LayoutConflictError(f"{kind} of {self.topic}: the layout changed or an operation is in progress")
        await self.step("intent")
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
        await self.step("children_created")
        if record["step"] != "terminate":
            record = {**record, "step": "terminate"}
            result = await self.store.metadata.txn(
                [*self.guard(), Compare.version(self.op_key, ">", 0)], [Op.put(self.op_key, dump_json(record))]
            )
            if not result.succeeded:
                raise NotLeaderError(f"lost the controller leadership of {self.topic} during a {record['op']}")
        await self.step("terminate_marked")
        # 3. terminate the parents, one after the other
        for p in parents:
            await self.ops.terminate_segment(segment_topic_name(self.topic, p))
        await self.step("parents_terminated")
        # 4. compare-and-swap the layout, dropping the record in the same transaction
        ok = await self.store.cas_layout(
            self.topic,
            layout_version,
            target,
            compare=[*self.guard(), Compare.version(self.op_key, ">", 0)],
            ops=[Op.delete(self.op_key)],
        )
        if not ok:
            raise LayoutConflictError(f"{record['op']} of {self.topic}: the layout CAS failed")
        await self.step("layout_updated")
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
        await self.subscriptions.notify(target)
        return target

    async def _recover(self) -> None:
        found = await self.store.load_operation(self.topic)
        if found is None:
            return
        record, _ = found
        if record.get("op") == "prune":  # the layout no longer has it: finish deleting its topic
            log.warning("completing the interrupted prune of %s (segment %s)", self.topic, record.get("segmentId"))
            await self.pruner.finish(record)
            return
        stored = await self.store.require(self.topic)
        if stored.layout.epoch != record.get("fromEpoch"):
            log.info("dropping the stale %s record of %s", record.get("op"), self.topic)
            await self.store.metadata.txn(self.guard(), [Op.delete(self.op_key)])
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
        await self.store.metadata.txn(self.guard(), [Op.delete(self.op_key)])

    # ------------------------------------------------------------ the other jobs (their modules)

    async def prune_tick(self, now: float) -> list[int]:
        """Prune every sealed segment that may go (``pruning``), oldest first; their ids."""
        return await self.pruner.tick(now)

    async def auto_split_tick(self, now: float) -> int | None:
        """One look of the automatic splitter (``autosplit``); the id of the segment split, or None."""
        return await self.auto_splitter.tick(now)

    async def create_subscription(self, sub: str, kind: str = STREAM) -> bool:
        return await self.subscriptions.create(sub, kind)

    async def delete_subscription(self, sub: str) -> bool:
        return await self.subscriptions.delete(sub)

    async def register_consumer(
        self, sub: str, name: str, consumer_id: int = 0, listener: Listener | None = None
    ) -> ConsumerAssignment:
        return await self.subscriptions.register_consumer(sub, name, consumer_id, listener)

    def consumer_disconnected(self, sub: str, name: str) -> None:
        self.subscriptions.consumer_disconnected(sub, name)

    async def unregister_consumer(self, sub: str, name: str) -> None:
        await self.subscriptions.unregister_consumer(sub, name)

    async def segment_drained(self, sub: str, segment_id: int) -> bool:
        return await self.subscriptions.segment_drained(sub, segment_id)
