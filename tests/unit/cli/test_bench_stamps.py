"""`danube bench`'s consumer reads each message's send time without per-message Python work: a
small batch through one struct unpack, a large one through numpy; both read the same stamps and
both refuse a batch that is not plain frames of the bench's size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube import message_codec as frame_codec
from danube.cli import bench_consumers
from danube.cli.bench_config import STAMP
from danube.cli.bench_consumers import stamp_reader

SIZE = 100


def _payloads(stamps) -> list[bytes]:
    return [STAMP.pack(t) + b"\x00" * (SIZE - STAMP.size) for t in stamps]


@pytest.mark.parametrize("count", [1, 2, 64, 65, 1000])  # either side of the struct/numpy split
def test_stamps_come_back_as_now_minus_send_time(count):
    stamps = [1000.0 + i / 8 for i in range(count)]
    frames = frame_codec.encode_payloads(_payloads(stamps), base_offset=7, publish_time=5, producer_id=3)
    samples = stamp_reader(SIZE)(frames, count, 2000.0)
    assert [float(s) for s in samples] == [2000.0 - t for t in stamps]


@pytest.mark.parametrize("count", [2, 200])
def test_a_batch_that_is_not_plain_bench_frames_is_refused(count):
    read = stamp_reader(SIZE)
    payloads = _payloads([1.0] * count)
    keyed = frame_codec.encode_payloads(payloads, key="k")
    with_attributes = frame_codec.encode_payloads(payloads, attributes={"a": "b"})
    other_size = frame_codec.encode_payloads([p + b"x" for p in payloads])
    plain = frame_codec.encode_payloads(payloads)
    assert read(keyed, count, 2.0) is None
    assert read(with_attributes, count, 2.0) is None
    assert read(other_size, count, 2.0) is None
    assert read(plain, count + 1, 2.0) is None  # the count does not match the bytes
    assert read(plain, 0, 2.0) is None


def test_a_size_below_the_stamp_reads_nothing():
    assert stamp_reader(STAMP.size - 1)(b"", 0, 1.0) is None


def test_without_numpy_large_batches_are_read_by_struct(monkeypatch):
    monkeypatch.setattr(bench_consumers, "_numpy_stamps", lambda frame_len, body_len: None)
    count = 300
    frames = frame_codec.encode_payloads(_payloads([1.5] * count))
    assert stamp_reader(SIZE)(frames, count, 2.0) == [0.5] * count


_frame = st.tuples(
    st.floats(0, 1e6, allow_nan=False),
    st.one_of(st.none(), st.text("ab", min_size=0, max_size=3)),  # a routing key, empty or not
    st.one_of(st.none(), st.dictionaries(st.just("a"), st.text("b", max_size=2), max_size=1)),
    st.integers(-3, 3),  # payload size off the bench's by this much
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_frame, min_size=1, max_size=6), st.integers(-1, 1))
def test_a_batch_is_read_exactly_when_every_frame_is_a_plain_bench_frame(frames, count_off):
    """Batches mixing keys, attributes and payload sizes (some the same total length as plain
    ones): the reader gives every stamp exactly when all frames are plain and of the bench's size,
    else None."""
    records = [
        (0, 0, key, attributes, STAMP.pack(t) + b"\x00" * (SIZE - STAMP.size + off))
        for t, key, attributes, off in frames
    ]
    buf = frame_codec.encode_records(records)
    count = len(frames) + count_off
    plain = count_off == 0 and all(key is None and not attrs and off == 0 for _, key, attrs, off in frames)
    samples = stamp_reader(SIZE)(buf, count, 2e6)
    if plain:
        assert samples == [2e6 - t for t, _, _, _ in frames]
    else:
        assert samples is None
