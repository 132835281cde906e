"""SegmentLayout: the pure model of a scalable topic's segment DAG (property tests)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.errors import NotFoundError
from danube.model.segment_layout import (
    HASH_MAX,
    HashRange,
    LayoutError,
    SegmentLayout,
    SegmentState,
    key_hash,
    murmur3_32,
)

PIP468_EXAMPLE = """{
  "epoch": 3,
  "nextSegmentId": 5,
  "segments": {
    "0": { "segmentId": 0, "hashRange": {"start": 0, "end": 65535}, "state": "SEALED", "parentIds": [],
           "childIds": [1, 2], "createdAtEpoch": 0, "sealedAtEpoch": 1 },
    "1": { "segmentId": 1, "hashRange": {"start": 0, "end": 32767}, "state": "SEALED", "parentIds": [0],
           "childIds": [3, 4], "createdAtEpoch": 1, "sealedAtEpoch": 3 },
    "2": { "segmentId": 2, "hashRange": {"start": 32768, "end": 65535}, "state": "ACTIVE", "parentIds": [0],
           "childIds": [], "createdAtEpoch": 1, "sealedAtEpoch": 0 },
    "3": { "segmentId": 3, "hashRange": {"start": 0, "end": 16383}, "state": "ACTIVE", "parentIds": [1],
           "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0 },
    "4": { "segmentId": 4, "hashRange": {"start": 16384, "end": 32767}, "state": "ACTIVE", "parentIds": [1],
           "childIds": [], "createdAtEpoch": 3, "sealedAtEpoch": 0 }
  },
  "properties": {}
}"""


def test_murmur3_reference_vectors():
    # MurmurHash3_x86_32 published test vectors
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"\xff\xff\xff\xff") == 0x76293B50
    assert murmur3_32(b"\x21\x43\x65\x87") == 0xF55B516B
    assert murmur3_32(b"\x21\x43\x65") == 0x7E4A8634
    assert murmur3_32(b"\x21\x43") == 0xA0F7B07A
    assert murmur3_32(b"\x21") == 0x72661CF4
    assert murmur3_32(b"Hello, world!", 1234) == 0xFAF6CDB3
    assert 0 <= key_hash("order-17") <= HASH_MAX
    assert key_hash("k") == key_hash(b"k")


def test_pip468_example_parses_and_round_trips():
    layout = SegmentLayout.from_json(PIP468_EXAMPLE)
    assert layout.epoch == 3 and layout.next_segment_id == 5
    assert [s.segment_id for s in layout.active_segments] == [3, 4, 2]
    assert layout.segment(0).state is SegmentState.SEALED
    assert layout.segment(1).child_ids == (3, 4)
    assert json.loads(layout.to_json()) == json.loads(PIP468_EXAMPLE)
    assert layout.find_active_segment(0x4000).segment_id == 4
    assert layout.lineage(3) == [0, 1, 3]
    assert layout.lineage(0) == [0, 1, 2, 3, 4]


def test_pip468_example_is_what_split_split_produces():
    layout = SegmentLayout.initial(1).split_segment(0)
    # PIP-468's example sealed segment 1 at epoch 3: one more layout change happened in between
    layout = SegmentLayout(layout.epoch + 1, layout.next_segment_id, layout.segments).split_segment(1)
    assert json.loads(layout.to_json()) == json.loads(PIP468_EXAMPLE)


def test_initial_and_errors():
    layout = SegmentLayout.initial(3)
    assert [(s.hash_range.start, s.hash_range.end) for s in layout.active_segments] == [
        (0, 21844),
        (21845, 43689),
        (43690, 65535),
    ]
    with pytest.raises(LayoutError):
        layout.merge_segments(0, 2)  # not adjacent
    with pytest.raises(LayoutError):
        layout.merge_segments(0, 0)
    with pytest.raises(NotFoundError):
        layout.split_segment(7)
    sealed = layout.split_segment(0)
    with pytest.raises(LayoutError):
        sealed.split_segment(0)
    with pytest.raises(LayoutError):
        sealed.prune_segment(1)
    twice = sealed.split_segment(3)
    with pytest.raises(LayoutError):
        twice.prune_segment(3)  # its parent 0 is still there
    pruned = twice.prune_segment(0)
    assert pruned.segment(3).parent_ids == () and pruned.prune_segment(3).segment(4).parent_ids == ()
    with pytest.raises(LayoutError):
        SegmentLayout.initial(0)
    with pytest.raises(LayoutError):
        SegmentLayout.from_json(b"[1]")
    with pytest.raises(LayoutError):
        SegmentLayout.from_json(b'{"epoch": 0}')
    with pytest.raises(LayoutError):
        HashRange(5, 4)
    one = SegmentLayout(0, 1, {0: layout.segment(0).__class__.active(0, HashRange(0, 0), 0)})
    with pytest.raises(LayoutError):
        one.validate()  # does not cover the range
    tiny = SegmentLayout.initial(HASH_MAX + 1)
    with pytest.raises(LayoutError):
        tiny.split_segment(5)  # a one-hash segment


def test_validate_rejects_inconsistent_dag():
    doc = json.loads(PIP468_EXAMPLE)
    doc["segments"]["3"]["parentIds"] = [2]
    with pytest.raises(LayoutError):
        SegmentLayout.from_metadata(doc)
    doc = json.loads(PIP468_EXAMPLE)
    doc["segments"]["2"]["state"] = "SEALED"
    with pytest.raises(LayoutError):
        SegmentLayout.from_metadata(doc)
    doc = json.loads(PIP468_EXAMPLE)
    doc["nextSegmentId"] = 4
    with pytest.raises(LayoutError):
        SegmentLayout.from_metadata(doc)


# ---------------------------------------------------------------- properties

operations = st.lists(st.tuples(st.sampled_from(["split", "merge", "prune"]), st.integers(0, 10_000)), max_size=40)


def apply(layout: SegmentLayout, op: str, pick: int) -> SegmentLayout:
    active = layout.active_segments
    if op == "split":
        candidates = [s for s in active if s.hash_range.size > 1]
        if not candidates:
            return layout
        return layout.split_segment(candidates[pick % len(candidates)].segment_id)
    if op == "merge":
        if len(active) < 2:
            return layout
        i = pick % (len(active) - 1)
        a, b = active[i], active[i + 1]
        return (
            layout.merge_segments(b.segment_id, a.segment_id)
            if pick % 2
            else layout.merge_segments(a.segment_id, b.segment_id)
        )
    sealed = [
        s for s in layout.segments.values() if not s.is_active and not any(p in layout.segments for p in s.parent_ids)
    ]
    if not sealed:
        return layout
    return layout.prune_segment(sealed[pick % len(sealed)].segment_id)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), operations, st.lists(st.integers(0, HASH_MAX), max_size=20))
def test_transitions_keep_every_invariant(initial, ops, hashes):
    layout = SegmentLayout.initial(initial).validate()
    for op, pick in ops:
        before = layout
        layout = apply(layout, op, pick)
        layout.validate()  # active ranges cover 0x0000-0xFFFF exactly once, DAG consistent
        if layout is not before:
            assert layout.epoch == before.epoch + 1
            assert layout.next_segment_id >= before.next_segment_id
            # the old layout is untouched (immutability)
            assert before.to_json() == SegmentLayout.from_json(before.to_json()).to_json()
        for sid, s in layout.segments.items():
            if sid in before.segments and op != "prune":
                # history never changes: a sealed segment stays sealed with the same record
                old = before.segments[sid]
                if not old.is_active:
                    assert s == old
        # JSON round trip
        assert SegmentLayout.from_json(layout.to_json()) == layout
        for h in hashes:
            seg = layout.find_active_segment(h)
            assert seg.hash_range.contains(h) and seg.is_active
            assert sum(1 for s in layout.active_segments if s.hash_range.contains(h)) == 1


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), operations)
def test_children_cover_exactly_their_parents(initial, ops):
    layout = SegmentLayout.initial(initial)
    for op, pick in ops:
        layout = apply(layout, op, pick)
    for s in layout.segments.values():
        if s.is_active or not s.child_ids or not all(c in layout.segments for c in s.child_ids):
            continue
        children = [layout.segments[c] for c in s.child_ids]
        if len(children) == 2:  # split: two children exactly partition the parent
            lo, hi = sorted(children, key=lambda c: c.hash_range.start)
            assert (lo.hash_range.start, lo.hash_range.end + 1, hi.hash_range.end) == (
                s.hash_range.start,
                hi.hash_range.start,
                s.hash_range.end,
            )
        else:  # merge: the child covers its parent
            (child,) = children
            assert child.hash_range.start <= s.hash_range.start <= s.hash_range.end <= child.hash_range.end
