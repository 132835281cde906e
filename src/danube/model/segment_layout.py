"""The segment layout of a scalable topic: an immutable, versioned DAG of hash-range segments.

Pure model (no I/O), after Pulsar PIP-468 scalable topics (``SegmentLayout``, ``SegmentInfo``):

- a scalable topic covers the hash range ``0x0000``–``0xFFFF``; its ACTIVE segments cover
  that range exactly once, each an inclusive ``[start, end]``;
- ``split_segment`` seals an active segment and adds two children ``[start, mid]`` and
  ``[mid+1, end]`` (``mid = (start+end)//2``); ``merge_segments`` seals two adjacent active
  segments and adds one child covering both; each increments the layout epoch, children are
  created and parents sealed at the new epoch; ids come from ``next_segment_id``;
- every mutation returns a NEW layout; the JSON codec is PIP-468's ``ScalableTopicMetadata``
  (camelCase keys: ``epoch``, ``nextSegmentId``, ``segments`` keyed by the id as a string,
  ``properties``).

Key hash: PIP-468 leaves it open; danube uses MurmurHash3 x86 32-bit (seed 0, the hash Pulsar's
key-shared routing uses) of the key's UTF-8 bytes, masked to 16 bits (:func:`key_hash`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from danube.errors import InvalidArgumentError, NotFoundError

HASH_MIN = 0x0000
HASH_MAX = 0xFFFF
HASH_SPACE = HASH_MAX + 1


class LayoutError(InvalidArgumentError):
    """An invalid layout, or a split/merge the layout does not allow."""


# ---------------------------------------------------------------- key hash


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit (Austin Appleby's reference algorithm)."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed & mask
    n = len(data)
    nblocks = n // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[4 * nblocks :]
    k = 0
    if len(tail) == 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def key_hash(key: str | bytes) -> int:
    """The 16-bit position of ``key`` in a scalable topic's hash range."""
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return murmur3_32(data) & HASH_MAX


# ---------------------------------------------------------------- records


@dataclass(frozen=True, order=True)
class HashRange:
    start: int
    end: int

    def __post_init__(self) -> None:
        if not (HASH_MIN <= self.start <= self.end <= HASH_MAX):
            raise LayoutError(f"invalid hash range [{self.start}, {self.end}]")

    def contains(self, h: int) -> bool:
        return self.start <= h <= self.end

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    def to_json(self) -> dict:
        return {"start": self.start, "end": self.end}

    def __str__(self) -> str:
        return f"{self.start:04x}-{self.end:04x}"


class SegmentState(str, Enum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"


@dataclass(frozen=True)
class SegmentInfo:
    segment_id: int
    hash_range: HashRange
    state: SegmentState
    parent_ids: tuple[int, ...] = ()
    child_ids: tuple[int, ...] = ()
    created_at_epoch: int = 0
    sealed_at_epoch: int = 0  # 0 while ACTIVE (a seal always increments the epoch, so never 0 when sealed)

    @classmethod
    def active(
        cls, segment_id: int, hash_range: HashRange, epoch: int, parent_ids: Iterable[int] = ()
    ) -> "SegmentInfo":
        return cls(segment_id, hash_range, SegmentState.ACTIVE, tuple(parent_ids), (), epoch, 0)

    def sealed(self, epoch: int, child_ids: Iterable[int]) -> "SegmentInfo":
        return replace(self, state=SegmentState.SEALED, child_ids=tuple(child_ids), sealed_at_epoch=epoch)

    @property
    def is_active(self) -> bool:
        return self.state is SegmentState.ACTIVE

    @property
    def descriptor(self) -> str:
        """``{hexStart}-{hexEnd}-{segmentId}`` as in PIP-468's Segments API (e.g. ``0000-7fff-1``)."""
        return f"{self.hash_range}-{self.segment_id}"

    def to_json(self) -> dict:
        return {
            "segmentId": self.segment_id,
            "hashRange": self.hash_range.to_json(),
            "state": self.state.value,
            "parentIds": list(self.parent_ids),
            "childIds": list(self.child_ids),
            "createdAtEpoch": self.created_at_epoch,
            "sealedAtEpoch": self.sealed_at_epoch,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "SegmentInfo":
        try:
            hr = doc["hashRange"]
            return cls(
                int(doc["segmentId"]),
                HashRange(int(hr["start"]), int(hr["end"])),
                SegmentState(doc["state"]),
                tuple(int(p) for p in doc.get("parentIds", ())),
                tuple(int(c) for c in doc.get("childIds", ())),
                int(doc.get("createdAtEpoch", 0)),
                int(doc.get("sealedAtEpoch", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LayoutError(f"unreadable segment record: {exc}") from None


def segment_topic_name(scalable_topic: str, segment: SegmentInfo) -> str:
    """The ordinary reliable topic backing ``segment`` (``/ns/name.seg.0000-7fff-1``)."""
    return f"{scalable_topic}.seg.{segment.descriptor}"


@dataclass(frozen=True)
class SegmentLayout:
    epoch: int
    next_segment_id: int
    segments: Mapping[int, SegmentInfo]
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", MappingProxyType(dict(sorted(self.segments.items()))))
        object.__setattr__(self, "properties", MappingProxyType(dict(self.properties)))

    # ------------------------------------------------------------ construction

    @classmethod
    def initial(cls, num_segments: int = 1, properties: Mapping[str, str] | None = None) -> "SegmentLayout":
        """``num_segments`` ACTIVE root segments dividing the hash range in equal parts, epoch 0."""
        if not 1 <= num_segments <= HASH_SPACE:
            raise LayoutError(f"a scalable topic has 1 to {HASH_SPACE} initial segments, not {num_segments}")
        segs = {}
        for i in range(num_segments):
            start = i * HASH_SPACE // num_segments
            end = (i + 1) * HASH_SPACE // num_segments - 1
            segs[i] = SegmentInfo.active(i, HashRange(start, end), 0)
        return cls(0, num_segments, segs, properties or {})

    # ------------------------------------------------------------ views

    @property
    def active_segments(self) -> list[SegmentInfo]:
        """ACTIVE segments sorted by hash range start."""
        return sorted((s for s in self.segments.values() if s.is_active), key=lambda s: s.hash_range.start)

    def segment(self, segment_id: int) -> SegmentInfo:
        try:
            return self.segments[segment_id]
        except KeyError:
            raise NotFoundError(f"segment {segment_id} does not exist (layout epoch {self.epoch})") from None

    def find_active_segment(self, h: int) -> SegmentInfo:
        for s in self.segments.values():
            if s.is_active and s.hash_range.contains(h):
                return s
        raise LayoutError(f"no active segment covers hash {h:#06x}")

    def segment_for_key(self, key: str | bytes) -> SegmentInfo:
        return self.find_active_segment(key_hash(key))

    def ancestors(self, segment_id: int) -> list[int]:
        out: list[int] = []
        todo = list(self.segment(segment_id).parent_ids)
        while todo:
            sid = todo.pop()
            if sid in out or sid not in self.segments:
                continue
            out.append(sid)
            todo.extend(self.segments[sid].parent_ids)
        return sorted(out)

    def descendants(self, segment_id: int) -> list[int]:
        out: list[int] = []
        todo = list(self.segment(segment_id).child_ids)
        while todo:
            sid = todo.pop()
            if sid in out or sid not in self.segments:
                continue
            out.append(sid)
            todo.extend(self.segments[sid].child_ids)
        return sorted(out)

    def lineage(self, segment_id: int) -> list[int]:
        """Ancestors, the segment, descendants (ids, sorted) — PIP-468's ``getLineage``."""
        return sorted(set(self.ancestors(segment_id)) | {segment_id} | set(self.descendants(segment_id)))

    # ------------------------------------------------------------ transitions (each returns a new layout)

    def _check_active(self, segment_id: int) -> SegmentInfo:
        seg = self.segment(segment_id)
        if not seg.is_active:
            raise LayoutError(f"segment {segment_id} is sealed (at epoch {seg.sealed_at_epoch})")
        return seg

    def split_segment(self, segment_id: int) -> "SegmentLayout":
        parent = self._check_active(segment_id)
        r = parent.hash_range
        if r.start == r.end:
            raise LayoutError(f"segment {segment_id} covers one hash value and cannot be split")
        mid = (r.start + r.end) // 2
        epoch = self.epoch + 1
        a, b = self.next_segment_id, self.next_segment_id + 1
        segs = dict(self.segments)
        segs[a] = SegmentInfo.active(a, HashRange(r.start, mid), epoch, (segment_id,))
        segs[b] = SegmentInfo.active(b, HashRange(mid + 1, r.end), epoch, (segment_id,))
        segs[segment_id] = parent.sealed(epoch, (a, b))
        return SegmentLayout(epoch, b + 1, segs, self.properties)

    def merge_segments(self, id1: int, id2: int) -> "SegmentLayout":
        s1, s2 = self._check_active(id1), self._check_active(id2)
        if s1.segment_id == s2.segment_id:
            raise LayoutError("cannot merge a segment with itself")
        lo, hi = sorted((s1, s2), key=lambda s: s.hash_range.start)
        if lo.hash_range.end + 1 != hi.hash_range.start:
            raise LayoutError(f"segments {id1} ({s1.hash_range}) and {id2} ({s2.hash_range}) are not adjacent")
        epoch = self.epoch + 1
        child = self.next_segment_id
        segs = dict(self.segments)
        segs[child] = SegmentInfo.active(
            child, HashRange(lo.hash_range.start, hi.hash_range.end), epoch, (lo.segment_id, hi.segment_id)
        )
        segs[lo.segment_id] = lo.sealed(epoch, (child,))
        segs[hi.segment_id] = hi.sealed(epoch, (child,))
        return SegmentLayout(epoch, child + 1, segs, self.properties)

    def prune_segment(self, segment_id: int) -> "SegmentLayout":
        """Drop a SEALED segment whose own parents are already pruned (history goes oldest first);
        its children forget it as a parent."""
        seg = self.segment(segment_id)
        if seg.is_active:
            raise LayoutError(f"segment {segment_id} is active and cannot be pruned")
        if any(p in self.segments for p in seg.parent_ids):
            raise LayoutError(f"segment {segment_id} still has parents in the layout; prune them first")
        segs = dict(self.segments)
        del segs[segment_id]
        for cid in seg.child_ids:
            if cid in segs:
                c = segs[cid]
                segs[cid] = replace(c, parent_ids=tuple(p for p in c.parent_ids if p != segment_id))
        return SegmentLayout(self.epoch + 1, self.next_segment_id, segs, self.properties)

    # ------------------------------------------------------------ validation

    def validate(self) -> "SegmentLayout":
        """Raise :class:`LayoutError` unless the layout is consistent; returns self."""
        if self.epoch < 0 or self.next_segment_id < 0:
            raise LayoutError("negative epoch or next segment id")
        for sid, s in self.segments.items():
            if sid != s.segment_id:
                raise LayoutError(f"segment keyed {sid} has id {s.segment_id}")
            if sid >= self.next_segment_id:
                raise LayoutError(f"segment id {sid} ≥ nextSegmentId {self.next_segment_id}")
            if s.created_at_epoch > self.epoch:
                raise LayoutError(f"segment {sid} created at epoch {s.created_at_epoch} > layout epoch")
            if s.is_active:
                if s.child_ids or s.sealed_at_epoch:
                    raise LayoutError(f"active segment {sid} has children or a seal epoch")
            elif not (s.created_at_epoch < s.sealed_at_epoch <= self.epoch):
                raise LayoutError(f"sealed segment {sid}: seal epoch {s.sealed_at_epoch} out of order")
            for c in s.child_ids:
                child = self.segments.get(c)
                if child is not None and sid not in child.parent_ids:
                    raise LayoutError(f"segment {c} is a child of {sid} but does not name it as parent")
                if child is not None and child.created_at_epoch != s.sealed_at_epoch:
                    raise LayoutError(f"segment {c} not created at its parent {sid}'s seal epoch")
            for p in s.parent_ids:
                parent = self.segments.get(p)
                if parent is not None and sid not in parent.child_ids:
                    raise LayoutError(f"segment {p} is a parent of {sid} but does not name it as child")
        expected = HASH_MIN
        for s in self.active_segments:
            if s.hash_range.start != expected:
                raise LayoutError(f"active segments leave a gap or overlap at {expected:#06x}")
            expected = s.hash_range.end + 1
        if expected != HASH_SPACE:
            raise LayoutError(f"active segments end at {expected - 1:#06x}, not {HASH_MAX:#06x}")
        return self

    # ------------------------------------------------------------ PIP-468's JSON

    def to_metadata(self) -> dict:
        return {
            "epoch": self.epoch,
            "nextSegmentId": self.next_segment_id,
            "segments": {str(sid): s.to_json() for sid, s in self.segments.items()},
            "properties": dict(self.properties),
        }

    @classmethod
    def from_metadata(cls, doc: Mapping[str, Any]) -> "SegmentLayout":
        try:
            segs = {int(k): SegmentInfo.from_json(v) for k, v in doc["segments"].items()}
            layout = cls(
                int(doc["epoch"]),
                int(doc["nextSegmentId"]),
                segs,
                {str(k): str(v) for k, v in (doc.get("properties") or {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LayoutError(f"unreadable scalable topic metadata: {exc!r}") from None
        return layout.validate()

    def to_json(self) -> bytes:
        return json.dumps(self.to_metadata(), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> "SegmentLayout":
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise LayoutError(f"scalable topic metadata is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise LayoutError("scalable topic metadata is not a JSON object")
        return cls.from_metadata(doc)
