"""The public API of danube.wal on real files."""

from __future__ import annotations

import asyncio
import threading

import pytest

from danube import message_codec
from danube.errors import (
    CorruptFrameError,
    FrameFormatError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    WalClosedError,
    WalError,
)
from danube.wal import Wal, WalRecord


def test_append_read_round_trip(open_wal):
    wal = open_wal()
    assert (wal.first_offset, wal.next_offset) == (0, 0)
    assert wal.append(b"one", key="k", attributes={"a": "1"}, publish_time=42) == 0
    assert wal.append_batch([b"two", b"three"], publish_time=43) == (1, 2)
    records = wal.read(0)
    assert [bytes(r.payload) for r in records] == [b"one", b"two", b"three"]
    assert [r.offset for r in records] == [0, 1, 2]
    assert records[0].routing_key == "k" and records[0].attributes == {"a": "1"}
    assert records[0].publish_time == 42 and records[2].publish_time == 43
    assert isinstance(records[0], WalRecord)
    assert [r.offset for r in wal.read(1, max_records=1)] == [1]
    assert wal.read(3) == []
    assert (wal.first_offset, wal.next_offset) == (0, 3)


def test_append_frames_stamps_in_place(open_wal):
    wal = open_wal()
    wal.append(b"x")
    buf = bytearray(message_codec.encode_payloads([b"a", b"b"], producer_id=7))
    assert wal.append_frames(buf) == (1, 2)
    assert [r.offset for r in message_codec.iter_records(buf)] == [1, 2]  # the caller's buffer was stamped
    assert bytes(wal.read_frames(1, 1 << 20)) == bytes(buf)


def test_append_batch_accepts_read_only_frames(open_wal):
    wal = open_wal()
    encoded = message_codec.encode_payloads([b"a", b"b", b"c"])
    assert wal.append_batch(encoded) == (0, 2)
    assert [r.offset for r in wal.read(0)] == [0, 1, 2]


def test_bad_frames_are_rejected_without_touching_the_log(open_wal):
    wal = open_wal()
    wal.append(b"keep")
    bad = bytearray(message_codec.encode_payloads([b"a", b"b"]))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptFrameError):
        wal.append_frames(bad)
    with pytest.raises(FrameFormatError):
        wal.append_frames(b"\x01\x02\x03")
    assert wal.next_offset == 1
    assert [bytes(r.payload) for r in wal.read(0)] == [b"keep"]


def test_read_frames_limits_and_zero_copy(open_wal):
    wal = open_wal()
    wal.append_batch([b"p" * 100] * 50)
    view = wal.read_frames(0, 500)
    assert isinstance(view, memoryview)
    count, first, last = message_codec.validate(view)
    assert first == 0 and count == last + 1 and len(view) <= 500
    one = wal.read_frames(10, 1)  # at least one whole frame even when over budget
    assert message_codec.validate(one)[0] == 1
    assert len(wal.read_frames(50, 1000)) == 0


def test_out_of_range_and_closed(open_wal):
    wal = open_wal()
    wal.append(b"x")
    with pytest.raises(OffsetOutOfRangeError) as info:
        wal.read(5)
    assert info.value.next_offset == 1
    wal.close()
    with pytest.raises(WalClosedError):
        wal.append(b"y")
    with pytest.raises(WalClosedError):
        wal.read(0)
    wal.close()  # idempotent


def test_options_are_validated(tmp_path):
    with pytest.raises(InvalidArgumentError):
        Wal.open(tmp_path / "a", sync="sometimes")
    with pytest.raises(InvalidArgumentError):
        Wal.open(tmp_path / "a", bogus=1)
    with pytest.raises(InvalidArgumentError):
        Wal.open(tmp_path / "a", max_file_bytes=10)


def test_one_writer_per_directory(open_wal, tmp_path):
    open_wal(tmp_path / "w")
    with pytest.raises(WalError):
        Wal.open(tmp_path / "w")


def test_reopen_keeps_everything_and_continues(tmp_path):
    with Wal.open(tmp_path / "w", sync="always") as wal:
        wal.append_batch([b"%d" % i for i in range(100)])
    with Wal.open(tmp_path / "w", sync="always") as wal:
        assert wal.next_offset == 100
        assert wal.append(b"more") == 100
        assert [bytes(r.payload) for r in wal.read(98)] == [b"98", b"99", b"more"]


def test_initial_offset_applies_to_an_empty_log_only(tmp_path):
    with Wal.open(tmp_path / "w", initial_offset=1000, sync="never") as wal:
        assert (wal.first_offset, wal.next_offset) == (1000, 1000)
        assert wal.append(b"a") == 1000
    with Wal.open(tmp_path / "w", initial_offset=5, sync="never") as wal:
        assert wal.next_offset == 1001
        assert [r.offset for r in wal.read(1000)] == [1000]


def test_iterators(open_wal):
    wal = open_wal()
    wal.append_batch([b"a", b"b", b"c"])
    assert [bytes(r.payload) for r in wal] == [b"a", b"b", b"c"]
    assert [r.offset for r in wal.iter(1)] == [1, 2]


def test_sync_always_is_durable_on_return(open_wal):
    wal = open_wal(sync="always")
    offset = wal.append(b"x")
    assert wal.durable_offset >= offset
    first, last = wal.append_batch([b"a", b"b"])
    assert wal.durable_offset >= last
    assert wal.sync() == last


async def test_wait_durable_group_commit(open_wal):
    wal = open_wal(sync="always")
    offsets = [wal.append(b"r%d" % i) for i in range(50)]  # inside a loop: no blocking sync
    assert wal.durable_offset < offsets[-1]
    before = wal.sync_count
    await asyncio.gather(*(wal.wait_durable(o) for o in offsets))
    assert wal.durable_offset >= offsets[-1]
    assert wal.sync_count - before < len(offsets)  # waiters shared fdatasyncs
    with pytest.raises(OffsetOutOfRangeError):
        await wal.wait_durable(10_000)


async def test_wait_durable_interval_and_never(open_wal, tmp_path):
    interval = open_wal(tmp_path / "i", sync="interval", sync_interval_ms=2)
    o = interval.append(b"x")
    await asyncio.wait_for(interval.wait_durable(o), 5)
    assert interval.durable_offset >= o
    never = open_wal(tmp_path / "n", sync="never")
    o = never.append(b"x")
    await never.wait_durable(o)
    assert never.durable_offset == o


async def test_tail_follows_live_appends(open_wal):
    wal = open_wal()
    wal.append(b"old")
    seen = []

    async def follow():
        async for record in wal.tail(0):
            seen.append(bytes(record.payload))
            if len(seen) == 4:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)
    wal.append(b"a")
    await asyncio.sleep(0)
    wal.append_batch([b"b", b"c"])
    await asyncio.wait_for(task, 5)
    assert seen == [b"old", b"a", b"b", b"c"]


async def test_tail_wakes_on_appends_from_another_thread(open_wal):
    wal = open_wal()
    got = []

    async def follow():
        async for view in wal.tail_frames(0, 1 << 16):
            got.extend(r.offset for r in message_codec.iter_records(view))
            if len(got) >= 300:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)

    def writer():
        for i in range(30):
            wal.append_batch([b"x" * 10] * 10)

    thread = threading.Thread(target=writer)
    thread.start()
    await asyncio.wait_for(task, 10)
    thread.join()
    assert got == list(range(300))


async def test_tail_ends_when_closed(open_wal):
    wal = open_wal()

    async def follow():
        return [r async for r in wal.tail()]

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.01)
    wal.close()
    assert await asyncio.wait_for(task, 5) == []


async def test_fanout_readers_share_the_same_bytes(open_wal):
    wal = open_wal()
    views: list[list[memoryview]] = [[] for _ in range(4)]

    async def reader(i):
        async for view in wal.tail_frames(0):
            views[i].append(view)
            if sum(message_codec.validate(v)[0] for v in views[i]) >= 20:
                return

    tasks = [asyncio.create_task(reader(i)) for i in range(4)]
    await asyncio.sleep(0.01)
    wal.append_batch([b"payload"] * 20)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    # all readers see the same underlying memory: one copy in the cache, none per reader
    assert all(bytes(v[0]) == bytes(views[0][0]) for v in views)
    assert all(v[0].obj is views[0][0].obj for v in views)


def test_readers_in_threads_concurrent_with_writer(open_wal):
    wal = open_wal(max_file_bytes=16 * 1024, cache_bytes=8 * 1024)
    errors = []
    done = threading.Event()

    def reader():
        try:
            pos = 0
            while not done.is_set() or pos < wal.next_offset:
                for record in wal.read(pos, max_records=100):
                    assert record.offset == pos
                    assert bytes(record.payload) == b"%08d" % pos
                    pos += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(0, 3000, 10):
        wal.append_batch([b"%08d" % j for j in range(i, i + 10)])
    done.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(wal.rotated_files()) > 3
