"""Live repartition of a partitioned topic ``/ns/t`` (partitions ``/ns/t-part-i``): the pure model.

No I/O here: the state of one topic's partitioning, the key -> partition function, the grow/shrink
state machine and the finalize rule (docs/repartition.md).

Two counters, kept apart:

- ``PartitioningState.version``: the partitioning version of the topic.  Every batch-lane publish
  carries the version it was routed under; an owner refuses a stale one.  The version bump *is*
  the cutover.
- the topology generation: the metadata store's revision of a routing snapshot, what clients ack.
  ``Transition.adoption_generation`` bridges the two: the generation of the commit that bumped the
  version (stamped right after the bump commits).

Routing: a key goes to ``fnv1a_64(key) % partitions`` under every version (the version-0 function
of ``danube.model.partitions``, the one Danube's clients use), so only the partition count changes.
A key moves from ``h % old`` to ``h % new``; the partitions a target ``t`` can receive moved keys
from are the ``s != t`` with ``s == t (mod gcd(old, new))`` (Chinese remainder theorem).

Order through a cutover (one subscription):

- every source ``s`` records ``old_end[s]``: the offset after the last message it stored under the
  old version (its owner stops accepting old-version publishes first);
- every target ``t`` with sources records ``new_start[t]``: the first offset that may hold a moved
  key (0 for a partition the grow creates);
- target ``t`` holds delivery of its offsets ``>= new_start[t]`` until every source of ``t`` has
  been consumed (acked) up to ``old_end[s]``.  On a grow that is the new partition holding the
  moved keys until their source's pre-cutover backlog drained; on a shrink the surviving partition
  holding offsets at/after the cutover until its merge sources drained.

Finalize: ``drained and (adopted or adoption timed out)``, the timeout measured
from when the transition first became drain-complete; a marker without an ``adoption_generation``
is ungated.  Finalizing a shrink retires the partitions ``>= to_partitions``: routing leaves them,
they stay readable (and keep what a client that still counts them publishes).  A grow may
finalize while subscriptions nobody consumes have not drained: their gate is kept as a
:class:`PendingHold` (the transition's offsets and those subscriptions) that holds exactly as the transition did, for them only, until each drained its sources.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from danube.errors import InvalidArgumentError
from danube.model.partitions import fnv1a_64

DEFAULT_ADOPTION_TIMEOUT_MS = 30_000
MAX_PARTITIONS = 4096

GROW = "grow"
SHRINK = "shrink"
MARKED = "marked"  # the transition marker is written, the version is not bumped yet
CUTOVER = "cutover"  # the version is bumped: routing uses to_partitions; draining


class RepartitionError(InvalidArgumentError):
    """A repartition request that cannot be carried out (same count, one in progress, ...)."""


def route(key: str, partitions: int) -> int:
    """The partition of ``key`` among ``partitions`` (every version: FNV-1a-64 modulo the count)."""
    return fnv1a_64(key.encode("utf-8")) % partitions


def sources_of(target: int, old: int, new: int) -> frozenset[int]:
    """Old partitions other than ``target`` from which keys move to ``target`` when ``old`` -> ``new``."""
    g = math.gcd(old, new)
    return frozenset(s for s in range(old) if s != target and s % g == target % g)


def targets_of(source: int, old: int, new: int) -> frozenset[int]:
    """New partitions other than ``source`` that receive keys of ``source`` when ``old`` -> ``new``."""
    g = math.gcd(old, new)
    return frozenset(t for t in range(new) if t != source and t % g == source % g)


@dataclass(frozen=True)
class Transition:
    """The transition marker of a grow or shrink in progress."""

    kind: str
    from_partitions: int
    to_partitions: int
    from_version: int
    to_version: int
    phase: str = MARKED
    started_ms: int = 0
    adoption_generation: int | None = None
    # per source partition: the offset after its last message stored under the old version
    old_end: Mapping[int, int] = field(default_factory=dict)
    # per target partition that has sources: the first offset that may hold a moved key
    new_start: Mapping[int, int] = field(default_factory=dict)
    drain_complete_ms: int | None = None

    @property
    def sources(self) -> frozenset[int]:
        """Old partitions that must drain (those keys move away from)."""
        return frozenset(
            s for s in range(self.from_partitions) if targets_of(s, self.from_partitions, self.to_partitions)
        )

    @property
    def targets(self) -> frozenset[int]:
        """New partitions that hold moved keys until their sources drained."""
        return frozenset(
            t for t in range(self.to_partitions) if sources_of(t, self.from_partitions, self.to_partitions)
        )

    def sources_of(self, target: int) -> frozenset[int]:
        return sources_of(target, self.from_partitions, self.to_partitions)

    @property
    def offsets_recorded(self) -> bool:
        """Every source's old_end and every target's new_start is known."""
        return self.sources <= set(self.old_end) and self.targets <= set(self.new_start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "from_partitions": self.from_partitions,
            "to_partitions": self.to_partitions,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "phase": self.phase,
            "started_ms": self.started_ms,
            "adoption_generation": self.adoption_generation,
            "old_end": {str(k): v for k, v in sorted(self.old_end.items())},
            "new_start": {str(k): v for k, v in sorted(self.new_start.items())},
            "drain_complete_ms": self.drain_complete_ms,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Transition":
        return cls(
            kind=d["kind"],
            from_partitions=int(d["from_partitions"]),
            to_partitions=int(d["to_partitions"]),
            from_version=int(d["from_version"]),
            to_version=int(d["to_version"]),
            phase=d.get("phase", MARKED),
            started_ms=int(d.get("started_ms", 0)),
            adoption_generation=d.get("adoption_generation"),
            old_end={int(k): int(v) for k, v in (d.get("old_end") or {}).items()},
            new_start={int(k): int(v) for k, v in (d.get("new_start") or {}).items()},
            drain_complete_ms=d.get("drain_complete_ms"),
        )


@dataclass(frozen=True)
class PendingHold:
    """A finalized grow's or shrink's gate, kept for the subscriptions that had not drained its sources."""

    transition: Transition
    subscriptions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"transition": self.transition.to_dict(), "subscriptions": list(self.subscriptions)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PendingHold":
        return cls(Transition.from_dict(d["transition"]), tuple(str(s) for s in d.get("subscriptions", ())))


@dataclass(frozen=True)
class PartitioningState:
    """One partitioned topic's routing: partition count, partitioning version, transition, retired."""

    partitions: int
    version: int = 0
    transition: Transition | None = None
    retired: tuple[int, ...] = ()  # a finalized shrink's partitions: out of routing, still read
    pending: tuple[PendingHold, ...] = ()  # finalized transitions still gating subscriptions that lag

    # ------------------------------------------------------------ routing

    def route(self, key: str) -> int:
        return route(key, self.partitions)

    def is_stale(self, version: int) -> bool:
        return version < self.version

    @property
    def active(self) -> range:
        return range(self.partitions)

    @property
    def live_partitions(self) -> int:
        """Partitions still open: during a shrink the shrunk-away ones drain until finalize."""
        t = self.transition
        return max(self.partitions, t.from_partitions) if t is not None else self.partitions

    @property
    def readable_partitions(self) -> int:
        """Partitions consumers read: the live ones and the retired ones (a Danube client that read
        the count before a shrink still publishes to them; those messages are kept and read)."""
        return max(self.live_partitions, max(self.retired, default=-1) + 1)

    # ------------------------------------------------------------ the state machine

    def begin(self, partitions: int, *, now_ms: int = 0) -> "PartitioningState":
        """Write the transition marker (phase ``marked``) for a grow or shrink to ``partitions``."""
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise RepartitionError(f"partitions must be 1..{MAX_PARTITIONS}, got {partitions}")
        if self.transition is not None:
            raise RepartitionError(
                f"a repartition to {self.transition.to_partitions} partitions is in progress "
                f"(phase {self.transition.phase}); it must finalize first"
            )
        if partitions == self.partitions:
            raise RepartitionError(f"the topic already has {partitions} partitions")
        kind = GROW if partitions > self.partitions else SHRINK
        marker = Transition(
            kind=kind,
            from_partitions=self.partitions,
            to_partitions=partitions,
            from_version=self.version,
            to_version=self.version + 1,
            started_ms=now_ms,
            new_start={t: 0 for t in range(self.partitions, partitions)},
        )
        return replace(self, transition=marker)

    def cutover(self) -> "PartitioningState":
        """The version bump: routing switches to ``to_partitions`` under ``to_version``."""
        t = self._require(MARKED)
        retired = tuple(p for p in self.retired if p >= t.to_partitions)  # a grow reopens retired ones
        return replace(
            self,
            partitions=t.to_partitions,
            version=t.to_version,
            retired=retired,
            transition=replace(t, phase=CUTOVER),
        )

    def stamp_adoption(self, generation: int) -> "PartitioningState":
        """The generation of the commit that bumped the version (stamped once, right after it)."""
        t = self._require(CUTOVER)
        if t.adoption_generation is not None:
            return self
        return replace(self, transition=replace(t, adoption_generation=int(generation)))

    def record_offsets(
        self,
        partition: int,
        next_offset: int | None = None,
        *,
        old_end: int | None = None,
        new_start: int | None = None,
    ) -> "PartitioningState":
        """What the owner of ``partition`` records when it applies the new version: as a source, the
        end of its old-version messages (``old_end``); as a target, where moved keys may start
        (``new_start``); ``next_offset`` sets both.  First value wins."""
        t = self._require(CUTOVER)
        if next_offset is not None:
            old_end = new_start = next_offset
        ends, starts = dict(t.old_end), dict(t.new_start)
        if old_end is not None and partition in t.sources and partition not in ends:
            ends[partition] = int(old_end)
        if new_start is not None and partition in t.targets and partition not in starts:
            starts[partition] = int(new_start)
        if ends == t.old_end and starts == t.new_start:
            return self
        return replace(self, transition=replace(t, old_end=ends, new_start=starts))

    def drained(self, consumed: Mapping[str, Mapping[int, int]]) -> bool:
        """Every source consumed up to its ``old_end`` by every subscription.

        ``consumed[sub][p]`` = the offset below which ``sub`` acked everything on partition ``p``
        (absent: the subscription has nothing there)."""
        t = self.transition
        if t is None or t.phase != CUTOVER or not t.offsets_recorded:
            return False
        return not lagging(t, consumed)

    def mark_drain_complete(self, now_ms: int) -> "PartitioningState":
        t = self._require(CUTOVER)
        if t.drain_complete_ms is not None:
            return self
        return replace(self, transition=replace(t, drain_complete_ms=int(now_ms)))

    def adopted(self, global_adoption: int | None) -> bool:
        """The fleet's lowest acked generation reached the marker's; a marker without one is ungated."""
        t = self.transition
        if t is None or t.phase != CUTOVER:
            return False
        if t.adoption_generation is None:
            return True
        return global_adoption is not None and global_adoption >= t.adoption_generation

    def can_finalize(
        self, now_ms: int, global_adoption: int | None, *, adoption_timeout_ms: int = DEFAULT_ADOPTION_TIMEOUT_MS
    ) -> bool:
        """finalize = drained_complete and (adopted or adoption_timed_out)."""
        t = self.transition
        if t is None or t.phase != CUTOVER or t.drain_complete_ms is None:
            return False
        timed_out = now_ms - t.drain_complete_ms >= adoption_timeout_ms
        return self.adopted(global_adoption) or timed_out

    def finalize(self, lagging: Iterable[str] = ()) -> "PartitioningState":
        """Clear the marker; a shrink retires the partitions it removed (out of routing, still read).
        ``lagging`` subscriptions (not drained, nobody consuming them) keep its gate as a pending
        hold: a consumer back later reads the retired partitions too, so a shrink's hold drains."""
        t = self._require(CUTOVER)
        if t.drain_complete_ms is None:
            raise RepartitionError("a transition finalizes only once drained")
        subs = tuple(sorted(set(lagging)))
        if subs and not t.offsets_recorded:
            raise RepartitionError("only a transition with every offset recorded finalizes with lagging subscriptions")
        pending = self.pending + ((PendingHold(t, subs),) if subs else ())
        retired = set(self.retired) | set(range(t.to_partitions, t.from_partitions))
        return replace(self, transition=None, retired=tuple(sorted(retired)), pending=pending)

    def release_holds(self, consumed: Mapping[int, Mapping[str, Mapping[int, int]]]) -> "PartitioningState":
        """Drop from each pending hold the subscriptions that drained its sources (``consumed[v]``:
        as for :meth:`drained`, for the hold of the grow to version ``v``; a subscription absent there
        has nothing left; a hold without an entry stays), and the holds left with none."""
        kept = []
        for hold in self.pending:
            seen = consumed.get(hold.transition.to_version)
            if seen is None:
                kept.append(hold)
                continue
            left = set(lagging(hold.transition, seen))
            subs = tuple(s for s in hold.subscriptions if s in left)
            if subs:
                kept.append(replace(hold, subscriptions=subs))
        return self if tuple(kept) == self.pending else replace(self, pending=tuple(kept))

    def gates(self) -> list[tuple[Transition, frozenset[str] | None]]:
        """What delivery is gated on: the transition in cutover (every subscription: None) and the
        pending holds (their subscriptions)."""
        out: list[tuple[Transition, frozenset[str] | None]] = [
            (h.transition, frozenset(h.subscriptions)) for h in self.pending
        ]
        if self.transition is not None and self.transition.phase == CUTOVER:
            out.append((self.transition, None))
        return out

    def _require(self, phase: str) -> Transition:
        t = self.transition
        if t is None or t.phase != phase:
            raise RepartitionError(f"no transition in phase {phase} (now: {t.phase if t else 'none'})")
        return t

    # ------------------------------------------------------------ delivery gate

    def holds(
        self, partition: int, offset: int, consumed: Mapping[int, int] | None, subscription: str | None = None
    ) -> bool:
        """Whether one subscription must hold ``offset`` of ``partition`` back (``consumed``: that
        subscription's consumed-below offset per partition)."""
        return any(
            transition_holds(t, partition, offset, consumed)
            for t, subs in self.gates()
            if subs is None or subscription in subs
        )

    # ------------------------------------------------------------ encoding

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "partitions": self.partitions,
            "version": self.version,
            "transition": self.transition.to_dict() if self.transition else None,
            "retired": list(self.retired),
        }
        if self.pending:
            d["pending"] = [h.to_dict() for h in self.pending]
        return d

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PartitioningState":
        t = d.get("transition")
        return cls(
            partitions=int(d["partitions"]),
            version=int(d.get("version", 0)),
            transition=Transition.from_dict(t) if t else None,
            retired=tuple(int(p) for p in d.get("retired", ())),
            pending=tuple(PendingHold.from_dict(h) for h in d.get("pending", ())),
        )

    @classmethod
    def from_json(cls, raw: bytes) -> "PartitioningState":
        return cls.from_dict(json.loads(raw))


def transition_holds(t: Transition, partition: int, offset: int, consumed: Mapping[int, int] | None) -> bool:
    """Whether ``t``'s gate holds ``offset`` of ``partition`` back for one subscription."""
    if partition not in t.targets:
        return False
    start = t.new_start.get(partition)
    if start is not None and offset < start:
        return False
    if start is None:  # the target's owner has not recorded it yet: hold conservatively
        return True
    return not all(s in t.old_end and source_drained(t, s, consumed or {}) for s in t.sources_of(partition))


def lagging(t: Transition, consumed: Mapping[str, Mapping[int, int]]) -> list[str]:
    """The subscriptions of ``consumed`` that have not consumed every source of ``t`` up to its ``old_end``."""
    return sorted(
        sub for sub, per_part in consumed.items() if not all(source_drained(t, s, per_part) for s in t.sources)
    )


def waiting_for(t: Transition, consumed: Mapping[str, Mapping[int, int]]) -> list[dict[str, Any]]:
    """Per subscription behind on a source of ``t``: the partition, where the subscription has
    consumed up to (acked below) and the ``old_end`` it waits for (unknown: None)."""
    out = []
    for sub, per_part in sorted(consumed.items()):
        for s in sorted(t.sources):
            if not source_drained(t, s, per_part):
                out.append(
                    {"subscription": sub, "partition": s, "consumed": per_part.get(s), "old_end": t.old_end.get(s)}
                )
    return out


def source_drained(t: Transition, source: int, consumed: Mapping[int, int]) -> bool:
    end = t.old_end.get(source)
    if end is None:
        return False
    return consumed.get(source, end) >= end


def sources_needing_drain(state: PartitioningState) -> Iterable[int]:
    t = state.transition
    return sorted(t.sources) if t is not None else ()
