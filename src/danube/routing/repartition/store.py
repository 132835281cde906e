"""Partitioning state in the MetadataStore (embedded or etcd).

Key (keys.py): ``/routing/partitioning/{ns}/{topic}`` holds the topic's
:class:`~danube.routing.repartition.model.PartitioningState` JSON.  A topic without the key is at
version 0 with the partition count of ``/topics/{ns}/{topic}/partitions`` (what the broker records
when a partition is created), so existing partitioned topics need no migration.

Every change is a compare-and-swap on the key's version (one transaction; the cutover also
rewrites the partition count key in the same transaction).  The topology generation a client acks
is the store revision: the cutover's commit revision is stamped as ``adoption_generation``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

from danube.errors import NotFoundError
from danube.metadata import keys
from danube.metadata.store import CompactedError, Compare, MetadataStore, Op
from danube.routing.repartition.model import PartitioningState, RepartitionError

CAS_ATTEMPTS = 50


@dataclass(frozen=True)
class StoredState:
    state: PartitioningState
    version: int  # the key's version (0: not stored yet, derived from the partition count)
    revision: int  # store revision it was read at or committed in


@dataclass(frozen=True)
class StateEvent:
    topic: str
    state: PartitioningState | None
    revision: int


def topic_of_key(key: str) -> str | None:
    prefix = keys.partitioning_prefix()
    if not key.startswith(prefix):
        return None
    rest = key[len(prefix) :]
    return "/" + rest if rest.count("/") == 1 else None


async def readable_partitions(metadata: MetadataStore, topic: str, count: int) -> int:
    """How many partitions of ``topic`` (whose partition count key says ``count``) a consumer reads:
    the count, the ones a shrink in progress still drains and the retired ones (they keep what
    clients that still count them publish), model.PartitioningState.readable_partitions."""
    kv = await metadata.get(keys.topic_partitioning(topic))
    if kv is None:
        return count
    return max(count, PartitioningState.from_json(kv.value).readable_partitions)


class RepartitionStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def load(self, topic: str) -> StoredState | None:
        """The topic's state; None when it is not a partitioned topic."""
        kv, revision = await self.metadata.get_with_revision(keys.topic_partitioning(topic))
        if kv is not None:
            return StoredState(PartitioningState.from_json(kv.value), kv.version, revision)
        count = await self.metadata.get_json(keys.topic_partitions(topic))
        if isinstance(count, int) and count > 0:
            return StoredState(PartitioningState(count), 0, revision)
        return None

    async def require(self, topic: str) -> StoredState:
        stored = await self.load(topic)
        if stored is None:
            raise NotFoundError(f"{topic} is not a partitioned topic (no partitions recorded)")
        return stored

    async def update(
        self,
        topic: str,
        change: Callable[[PartitioningState], PartitioningState],
        *,
        extra_ops: Callable[[PartitioningState], Sequence[Op]] = lambda s: (),
        compare: Sequence[Compare] = (),
    ) -> StoredState:
        """Apply ``change`` by compare-and-swap (retried on a concurrent write). ``change`` may raise
        RepartitionError; returning the same state writes nothing."""
        key = keys.topic_partitioning(topic)
        for _ in range(CAS_ATTEMPTS):
            stored = await self.require(topic)
            new = change(stored.state)
            if new == stored.state and stored.version:
                return stored
            result = await self.metadata.txn(
                [Compare.version(key, "==", stored.version), *compare], [Op.put(key, new.to_json()), *extra_ops(new)]
            )
            if result.succeeded:
                return StoredState(new, stored.version + 1, result.revision)
            if compare and not await self._compares_hold(compare):
                raise RepartitionError("a guard of the update no longer holds (leadership lost?)")
        raise RepartitionError(f"partitioning state of {topic} kept changing: gave up after {CAS_ATTEMPTS} tries")

    async def _compares_hold(self, compare: Sequence[Compare]) -> bool:
        result = await self.metadata.txn(list(compare))
        return result.succeeded

    # ------------------------------------------------------------ the transitions

    async def repartition(
        self, topic: str, partitions: int, *, now_ms: int, compare: Sequence[Compare] = ()
    ) -> StoredState:
        """Marker, then the version bump (the cutover, with the partition count key), then the
        ``adoption_generation`` stamp: the bump's commit revision."""
        await self.update(topic, lambda s: s.begin(partitions, now_ms=now_ms), compare=compare)
        return await self.resume(topic, compare=compare)

    async def resume(self, topic: str, *, compare: Sequence[Compare] = ()) -> StoredState:
        """Carry a marker left in phase ``marked`` (a crash between the steps) through its cutover and stamp."""
        stored = await self.require(topic)
        t = stored.state.transition
        if t is not None and t.phase == "marked":
            subs = await self._new_partition_subscriptions(topic, t.from_partitions, t.to_partitions)
            # a grow reopens the retired partitions it covers again; a terminated marker (an earlier
            # version terminated retired partitions) goes with the bump
            reopened = [
                Op.delete(keys.topic_terminated(f"{topic}-part-{p}"))
                for p in stored.state.retired
                if p < t.to_partitions
            ]
            bumped = False

            def bump(s: PartitioningState) -> PartitioningState:
                nonlocal bumped
                bumped = s.transition is not None and s.transition.phase == "marked"
                return s.cutover() if bumped else s

            stored = await self.update(
                topic,
                bump,
                extra_ops=lambda s: [
                    Op.put(keys.topic_partitions(topic), str(s.partitions).encode()),
                    *subs,
                    *reopened,
                ],
                compare=compare,
            )
            bump_revision: int | None = stored.revision
            if not bumped:
                # another resume committed it (the admin's call and the leader's finalizer both carry
                # a marker they see): this read's revision is later than the bump's, which is what the
                # brokers push and the clients ack, so stamping it would never count as adopted; the
                # partition count was written in the bump's commit
                kv = await self.metadata.get(keys.topic_partitions(topic))
                bump_revision = kv.mod_revision if kv is not None else None
            if bump_revision is not None:
                stamp = bump_revision
                stored = await self.update(
                    topic,
                    lambda s: s.stamp_adoption(stamp) if s.transition and s.transition.phase == "cutover" else s,
                    compare=compare,
                )
        return stored

    async def _new_partition_subscriptions(self, topic: str, old: int, new: int) -> list[Op]:
        """Each partition the grow adds is created (the delivery document of the old partitions), so
        a consumer that attaches on the push, before any producer wrote there, finds it; and every
        subscription of the old partitions is created on it with its cursor before offset 0, so no
        message published there before a consumer attaches is skipped."""
        ops: list[Op] = []
        delivery = None
        for p in range(old):
            delivery = await self.metadata.get(keys.topic_delivery(f"{topic}-part-{p}"))
            if delivery is not None:
                break
        if delivery is not None:
            for q in range(old, new):
                if await self.metadata.get(keys.topic_delivery(f"{topic}-part-{q}")) is None:
                    ops.append(Op.put(keys.topic_delivery(f"{topic}-part-{q}"), delivery.value))
        subs: dict[str, bytes] = {}
        for p in range(old):
            prefix = keys.topic_subscriptions(f"{topic}-part-{p}")
            for kv in await self.metadata.get_prefix(prefix):
                rest = kv.key[len(prefix) :]
                if "/" not in rest:
                    subs.setdefault(rest, kv.value)
        for q in range(old, new):
            part = f"{topic}-part-{q}"
            for name, record in subs.items():
                if await self.metadata.get(keys.subscription(part, name)) is None:
                    ops += [
                        Op.put(keys.subscription(part, name), record),
                        Op.put(keys.subscription_cursor(part, name), b"-1"),
                    ]
        return ops

    async def record_offsets(
        self,
        topic: str,
        partition: int,
        next_offset: int | None = None,
        *,
        old_end: int | None = None,
        new_start: int | None = None,
        to_version: int | None = None,
    ) -> StoredState:
        """An owner's record of where the old version ended / moved keys may start on ``partition``
        (ignored unless the transition in cutover is the one to ``to_version``, when given)."""

        def change(s: PartitioningState) -> PartitioningState:
            if s.transition is None or s.transition.phase != "cutover":
                return s
            if to_version is not None and s.transition.to_version != to_version:
                return s
            return s.record_offsets(partition, next_offset, old_end=old_end, new_start=new_start)

        return await self.update(topic, change)

    async def mark_drain_complete(self, topic: str, now_ms: int, *, compare: Sequence[Compare] = ()) -> StoredState:
        return await self.update(topic, lambda s: s.mark_drain_complete(now_ms), compare=compare)

    async def finalize(
        self, topic: str, *, lagging: Sequence[str] = (), compare: Sequence[Compare] = ()
    ) -> StoredState:
        """Clear the marker (a shrink retires the partitions it removed: routing and the fence leave
        them, their history stays readable, and a publish of a client that still counts them is
        stored there and read, docs/repartition.md).  A grow's ``lagging`` subscriptions keep its
        gate as a pending hold (model.PartitioningState.finalize)."""
        return await self.update(topic, lambda s: s.finalize(lagging), compare=compare)

    async def release_holds(
        self, topic: str, consumed: dict[int, dict[str, dict[int, int]]], *, compare: Sequence[Compare] = ()
    ) -> StoredState:
        """Drop the subscriptions that drained a pending hold's sources (and emptied holds)."""
        return await self.update(topic, lambda s: s.release_holds(consumed), compare=compare)

    # ------------------------------------------------------------ reading the routing content

    async def snapshot(self) -> tuple[dict[str, PartitioningState], int]:
        """Every stored partitioning state and the revision they were read at."""
        kvs, revision = await self.metadata.get_prefix_with_revision(keys.partitioning_prefix())
        states = {}
        for kv in kvs:
            topic = topic_of_key(kv.key)
            if topic is not None:
                states[topic] = PartitioningState.from_json(kv.value)
        return states, revision

    async def watch(self, *, start_revision: int | None = None) -> AsyncIterator[StateEvent]:
        """Every change of a partitioning state from ``start_revision``; after a compaction the
        current states are delivered again (at the revision they were read at) and it follows on."""
        next_rev = start_revision
        while True:
            try:
                async for ev in self.metadata.watch(keys.partitioning_prefix(), start_revision=next_rev):
                    topic = topic_of_key(ev.key)
                    next_rev = ev.revision + 1
                    if topic is None:
                        continue
                    state = PartitioningState.from_json(ev.value) if ev.kind == "put" and ev.value else None
                    yield StateEvent(topic, state, ev.revision)
                return
            except CompactedError:
                states, revision = await self.snapshot()
                for topic, state in states.items():
                    yield StateEvent(topic, state, revision)
                next_rev = revision + 1
                await asyncio.sleep(0)
