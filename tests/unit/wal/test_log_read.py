"""``Wal.read_hot``: a consumer's read at the live end answers as ``read_frames`` does, with None
where that raises ``OffsetOutOfRangeError`` or the offset is below the log's start or the
caller's floor."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.errors import OffsetOutOfRangeError, WalClosedError


def _expected(wal, offset: int, max_bytes: int, floor: int):
    # below the log's start the cache may still hold a pruned offset, which read_frames answers
    # from: read_hot leaves those to the caller's other way, as it leaves those below its floor
    if offset < floor or offset < wal.first_offset:
        return None
    try:
        return bytes(wal.read_frames(offset, max_bytes))
    except OffsetOutOfRangeError:
        return None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.integers(1, 20), min_size=1, max_size=30),
    prune=st.integers(-1, 300),
    floor=st.integers(0, 300),
    max_bytes=st.sampled_from([1, 200, 1 << 20]),
)
def test_read_hot_answers_as_read_frames_across_rotations_and_pruning(
    open_wal, tmp_path, batches, prune, floor, max_bytes
):
    # small files and a small cache: offsets come from the cache, from rotated files, or are pruned
    wal = open_wal(tmp_path / f"wal-{len(list(tmp_path.iterdir()))}", max_file_bytes=4096, cache_bytes=2048)
    n = 0
    for size in batches:
        wal.append_batch([b"%06d" % i * 4 for i in range(n, n + size)])
        n += size
    if prune >= 0:
        wal.prune_through(prune)
    for offset in range(0, n + 2):
        got = wal.read_hot(offset, max_bytes, floor)
        assert (None if got is None else bytes(got)) == _expected(wal, offset, max_bytes, floor), offset


def test_read_hot_of_a_closed_wal_raises_as_read_frames(open_wal):
    wal = open_wal()
    wal.append_batch([b"a", b"b"])
    assert bytes(wal.read_hot(1, 1 << 20)) == bytes(wal.read_frames(1, 1 << 20))
    assert len(wal.read_hot(2, 1 << 20)) == 0  # the end: empty, as read_frames
    wal.close()
    with pytest.raises(WalClosedError):
        wal.read_hot(0, 1 << 20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.integers(1, 20), min_size=1, max_size=30),
    prune=st.integers(-1, 300),
    floor=st.integers(0, 300),
    max_messages=st.integers(0, 25),
    max_bytes=st.sampled_from([1, 200, 1 << 20]),
)
def test_read_deliverable_is_read_frames_cut_to_the_limits_or_none(
    open_wal, tmp_path, batches, prune, floor, max_messages, max_bytes
):
    from danube import message_codec

    wal = open_wal(tmp_path / f"wal-{len(list(tmp_path.iterdir()))}", max_file_bytes=4096, cache_bytes=2048)
    n = 0
    for size in batches:
        wal.append_batch([b"%06d" % i * 4 for i in range(n, n + size)])
        n += size
    if prune >= 0:
        wal.prune_through(prune)
    for offset in range(0, n + 2):
        got = wal.read_deliverable(offset, max_messages, max_bytes, floor)
        whole = _expected(wal, offset, max_bytes, floor)
        if got is None:  # not at hand that way: never for the newest offsets, which the cache holds
            assert not whole or max_messages == 0 or offset < wal._ring.first_offset, offset
            continue
        view, count = got
        assert whole, offset
        end, expected_count = message_codec.frames_within(whole, max_messages, max_bytes)
        assert (bytes(view), count) == (whole[:end], expected_count), offset
        assert [r.offset for r in message_codec.iter_records(view)] == list(range(offset, offset + count))


def test_read_deliverable_of_a_closed_wal_is_none(open_wal):
    wal = open_wal()
    wal.append_batch([b"a", b"b"])
    assert wal.read_deliverable(0, 5, 1 << 20)[1] == 2
    wal.close()
    assert wal.read_deliverable(0, 5, 1 << 20) is None  # (the caller's general path raises)
