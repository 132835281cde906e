"""`danube bench`'s consumer reads each message's send time without per-message Python work: a
small batch through one struct unpack, a large one through numpy; both read the same stamps and
both refuse a batch that is not plain frames of the bench's size."""

from __future__ import annotations

import pytest

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
