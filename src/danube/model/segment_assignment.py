"""Which segments each ordered consumer of a scalable topic reads (pure; the broker-side
coordinator in `danube.routing.scalable.sessions` computes it, the client reads it).

Assignment (:func:`assign`), for one subscription:

- ACTIVE segments sorted by hash range start are dealt round robin to the consumers sorted by
  name;
- a SEALED segment the subscription has not drained yet, whose parents are all drained, goes
  to the consumer holding the active segment that covers its range start (its descendant);
- a segment whose parents are not all drained is assigned but *waiting* (``waiting_for`` lists
  the parents): the consumer must not read it yet.  When a parent is reported drained the
  coordinator recomputes and pushes, so a child is never delivered before its parents are
  drained and per-key order holds through splits and merges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from danube.model.segment_layout import HashRange, SegmentInfo, SegmentLayout, segment_topic_name


@dataclass(frozen=True)
class AssignedSegment:
    segment_id: int
    hash_range: HashRange
    topic_name: str  # the segment's underlying reliable topic
    sealed: bool = False
    waiting_for: tuple[int, ...] = ()  # parents not yet drained: do not read this segment yet

    def to_json(self) -> dict:
        return {
            "segmentId": self.segment_id,
            "hashRange": self.hash_range.to_json(),
            "underlyingTopicName": self.topic_name,
            "sealed": self.sealed,
            "waitingFor": list(self.waiting_for),
        }

    @classmethod
    def from_json(cls, doc: Mapping) -> "AssignedSegment":
        hr = doc["hashRange"]
        return cls(
            int(doc["segmentId"]),
            HashRange(int(hr["start"]), int(hr["end"])),
            str(doc["underlyingTopicName"]),
            bool(doc.get("sealed", False)),
            tuple(int(p) for p in doc.get("waitingFor", ())),
        )


@dataclass(frozen=True)
class ConsumerAssignment:
    layout_epoch: int
    segments: tuple[AssignedSegment, ...] = ()

    @property
    def segment_ids(self) -> list[int]:
        return [s.segment_id for s in self.segments]

    def to_json(self) -> dict:
        return {"layoutEpoch": self.layout_epoch, "assignedSegments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, doc: Mapping) -> "ConsumerAssignment":
        return cls(
            int(doc.get("layoutEpoch", 0)), tuple(AssignedSegment.from_json(s) for s in doc.get("assignedSegments", ()))
        )


def assign(
    topic: str, layout: SegmentLayout, consumers: Iterable[str], drained: Iterable[int] = ()
) -> dict[str, ConsumerAssignment]:
    """Every consumer's assignment for one subscription (see the module docstring)."""
    names = sorted(set(consumers))
    out: dict[str, list[AssignedSegment]] = {n: [] for n in names}
    if not names:
        return {}
    done = set(drained)

    def waiting(seg: SegmentInfo) -> tuple[int, ...]:
        return tuple(p for p in seg.parent_ids if p in layout.segments and p not in done)

    active = layout.active_segments
    owner_of_active: dict[int, str] = {}
    for i, seg in enumerate(active):
        name = names[i % len(names)]
        owner_of_active[seg.segment_id] = name
        out[name].append(
            AssignedSegment(seg.segment_id, seg.hash_range, segment_topic_name(topic, seg), False, waiting(seg))
        )
    for seg in layout.segments.values():
        if seg.is_active or seg.segment_id in done:
            continue
        w = waiting(seg)
        if w:
            continue  # its own parents come first; it is assigned once they are drained
        holder = layout.find_active_segment(seg.hash_range.start)
        name = owner_of_active[holder.segment_id]
        out[name].append(AssignedSegment(seg.segment_id, seg.hash_range, segment_topic_name(topic, seg), True, ()))
    return {
        n: ConsumerAssignment(layout.epoch, tuple(sorted(segs, key=lambda s: (s.hash_range.start, s.segment_id))))
        for n, segs in out.items()
    }
