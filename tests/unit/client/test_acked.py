"""AckedOffsets (merged ranges) against a plain set, and MessageBatch.without."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube import message_codec as frame_codec
from danube.client.acked import AckedOffsets
from danube.client.messages import MessageBatch

ranges = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ranges, st.lists(st.integers(0, 330), max_size=40))
def test_acked_offsets_match_a_set(added, probes):
    acked = AckedOffsets()
    model: set[int] = set()
    for first, length in added:
        acked.add_range(first, first + length)
        model.update(range(first, first + length + 1))
    for offset in list(model) + probes:
        assert (offset in acked) == (offset in model)
    got = acked.ranges()
    assert all(a <= b for a, b in got)
    assert all(got[i][1] + 1 < got[i + 1][0] for i in range(len(got) - 1))  # disjoint, not touching
    assert acked.highest == (max(model) if model else -1)


def test_in_order_acks_keep_one_range():
    acked = AckedOffsets()
    acked.add_many(range(100_000))
    assert acked.ranges() == [(0, 99_999)]


def test_only_the_newest_ranges_are_kept():
    acked = AckedOffsets(max_ranges=10)
    for offset in range(0, 100, 2):  # 50 separate ranges
        acked.add(offset)
    assert len(acked) <= 20
    assert 98 in acked and 0 not in acked


def test_bad_range_is_rejected():
    with pytest.raises(ValueError):
        AckedOffsets().add_range(5, 4)
    with pytest.raises(ValueError):
        AckedOffsets(max_ranges=0)


def _batch(offsets, redelivery_counts=None) -> MessageBatch:
    frames = bytearray(frame_codec.encode_payloads([b"m%d" % o for o in offsets]))
    positions = frame_codec.frame_positions(frames)
    for pos, offset in zip(positions, offsets):  # stamp each frame's offset as the broker would
        frames[pos : pos + 8] = offset.to_bytes(8, "little")
    return MessageBatch(
        "/default/t", 0, bytes(frames), offsets[0], offsets[-1], len(offsets), redelivery_counts, stream=3
    )


def test_batch_without_acked_messages():
    batch = _batch([4, 5, 6, 7], [1, 1, 0, 0])
    acked = AckedOffsets()
    acked.add_range(5, 6)
    rest, skipped = batch.without(acked)
    assert skipped == [5, 6]
    assert rest.offsets() == [4, 7] and rest.count == 2 and rest.first_offset == 4 and rest.last_offset == 7
    assert rest.payloads() == [b"m4", b"m7"]
    assert rest.redelivery_counts == [1, 0] and rest._stream == 3
    frame_codec.validate(rest.frames)
    assert batch.without(AckedOffsets()) == (batch, [])
    acked.add_range(0, 10)
    assert batch.without(acked) == (None, [4, 5, 6, 7])
