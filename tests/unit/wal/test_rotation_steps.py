"""Rotation in the background: a crash between any two of its steps loses nothing the log
promised, and the sync thread's cadence.

A "crash" here is a copy of the directory taken while the log is open and its background
thread is held at a chosen step: the page cache is what a killed process leaves behind.
A machine crash is that copy minus what was never fdatasync'd (edited in by hand).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time

import pytest

from danube.wal import Wal
from danube.wal.checkpoint import read_checkpoint
from danube.wal.files import list_segment_files
from tests.support.waiting import async_wait_until, wait_until

HEADER = 64


def _fill(wal, n, size=200, start=0):
    return [wal.append(b"%06d" % (start + i) + b"." * (size - 6)) for i in range(n)]


def _spare_ahead(wal):
    """Have the file worker make a spare now (it makes one only after the log's first rotation)."""
    keeper = wal._keeper
    with keeper._cond:
        keeper._want_spare = True
        keeper._kick()
    wait_until(lambda: keeper._spare is not None, timeout=10, interval=0.005)


def _spare_paths(directory):
    out = []
    for _seq, path in list_segment_files(str(directory)):
        with open(path, "rb") as f:
            if not any(f.read(HEADER)):
                out.append(path)
    return out


def _crash_copy(src, dst):
    """What a killed process leaves: every file as the page cache holds it now."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("wal.lock"))
    return dst


def _check_reopened(path, count, **options):
    options.setdefault("sync", "never")
    with Wal.open(path, **options) as wal:
        records = wal.read(0)
        assert [bytes(r.payload)[:6] for r in records] == [b"%06d" % i for i in range(count)]
        assert wal.next_offset == count
        assert wal.append(b"after") == count  # appends continue after the last record
        return wal.recovery


@pytest.fixture
def held():
    """Pause the WAL's background file thread at a lock it takes (released at the end)."""
    locks = []

    def hold(lock):
        lock.acquire()
        locks.append(lock)

    yield hold
    for lock in locks:
        lock.release()


def test_spare_is_made_ahead_and_used(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always")
    _fill(wal, 20)  # no rotation yet: no spare (an idle or small log holds one file)
    time.sleep(0.05)
    assert wal._keeper._spare is None and _spare_paths(tmp_path / "w") == []
    _fill(wal, 20, start=20)  # the first rotation: from now on a spare is kept ahead
    wait_until(lambda: wal._keeper._spare is not None, timeout=10, interval=0.005)
    spare = wal._keeper._spare
    assert _spare_paths(tmp_path / "w") == [spare.path]
    _fill(wal, 60)  # more than one file: the first rotation takes the spare
    assert wal._keeper.spares_used >= 1
    assert any(f.seq == spare.seq for f in wal.rotated_files()) or wal._writer.segment.seq == spare.seq
    wal.close()
    assert _spare_paths(tmp_path / "w") == []  # close deletes the unused spare


def test_crash_with_an_unused_spare(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always")
    _fill(wal, 20)
    _spare_ahead(wal)
    copy = _crash_copy(tmp_path / "w", tmp_path / "crash")
    spares = [os.path.join(copy, os.path.basename(p)) for p in _spare_paths(copy)]
    assert len(spares) == 1
    report = _check_reopened(copy, 20, sync="always")
    assert report.removed_empty == spares and not os.path.exists(spares[0])


def test_crash_after_the_switch_before_the_old_file_is_trimmed(open_wal, tmp_path, held):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="interval")
    _spare_ahead(wal)
    held(wal._syncer.lock)  # the background thread trims under this lock: it stops right there
    _fill(wal, 50)  # one rotation (34 records a file)
    (old,) = wal.rotated_files()
    assert os.path.getsize(old.path) == 8192, "not trimmed yet"
    assert old.seq not in read_checkpoint(str(tmp_path / "w")).rotated
    copy = _crash_copy(tmp_path / "w", tmp_path / "crash")
    report = _check_reopened(copy, 50)
    copied_old = os.path.join(copy, os.path.basename(old.path))
    assert copied_old in report.scanned_files  # not in the checkpoint: scanned, then trimmed
    assert os.path.getsize(copied_old) == old.size


def test_crash_after_the_trim_before_the_checkpoint(open_wal, tmp_path, held):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always")
    _spare_ahead(wal)
    held(wal._keeper._ckpt_lock)  # the checkpoint write waits here
    _fill(wal, 50)
    (old,) = wal.rotated_files()
    wait_until(lambda: os.path.getsize(old.path) == old.size, timeout=10, interval=0.005)  # trimmed and synced
    assert old.seq not in read_checkpoint(str(tmp_path / "w")).rotated
    copy = _crash_copy(tmp_path / "w", tmp_path / "crash")
    report = _check_reopened(copy, 50)
    assert os.path.join(copy, os.path.basename(old.path)) in report.scanned_files


def test_checkpoint_written_then_the_file_is_trusted(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always")
    _fill(wal, 50)
    assert wal.finish_rotations(timeout=10)
    (old,) = wal.rotated_files()
    assert read_checkpoint(str(tmp_path / "w")).rotated[old.seq] == (old.first_offset, old.last_offset, old.size)
    copy = _crash_copy(tmp_path / "w", tmp_path / "crash")
    report = _check_reopened(copy, 50)
    assert os.path.join(copy, os.path.basename(old.path)) not in report.scanned_files


@pytest.mark.parametrize("lost", ["header", "header_and_frames"])
def test_machine_crash_before_the_new_file_was_synced(open_wal, tmp_path, held, lost):
    """The new file's header never reached the disk (no fdatasync covered it yet): recovery
    drops the file, the old one continues the log; nothing in the new file was durable."""
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="interval", sync_interval_ms=60_000)
    _spare_ahead(wal)
    held(wal._syncer.lock)
    _fill(wal, 50)
    (old,) = wal.rotated_files()
    active = wal._writer.segment
    assert wal.durable_offset < old.first_offset + 50 - 1
    copy = _crash_copy(tmp_path / "w", tmp_path / "crash")
    new_copy = os.path.join(copy, os.path.basename(active.path))
    with open(new_copy, "r+b") as f:
        if lost == "header":
            f.write(bytes(HEADER))
        else:
            f.write(bytes(active.write_pos))
    with Wal.open(copy, sync="never") as again:
        assert new_copy in again.recovery.removed_empty
        # its name may come back at once as the reopened log's next spare (all-zero header)
        assert not os.path.exists(new_copy) or _spare_paths(copy) == [new_copy]
        assert again.next_offset == old.last_offset + 1
        assert [r.offset for r in again.read(0)] == list(range(old.last_offset + 1))
        assert again.append(b"x") == old.last_offset + 1


async def test_offset_in_a_just_rotated_file_is_synced_before_it_counts_as_durable(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always")
    _spare_ahead(wal)
    gate = threading.Event()
    finish = wal._keeper._finish
    wal._keeper._finish = lambda batch: (gate.wait(10), finish(batch))  # the background trim waits
    try:
        frames_ = [wal.append_frames(bytearray(_frame(i))) for i in range(50)]
        (old,) = wal.rotated_files()
        assert wal._keeper.unsynced and wal._keeper.unsynced[0].seq == old.seq
        before = wal.sync_count
        await wal.wait_durable(frames_[-1][1])  # in the new file
        assert not wal._keeper.unsynced, "the sync thread synced the rotated file itself"
        assert wal.sync_count > before and wal.durable_offset >= frames_[-1][1]
    finally:
        gate.set()
    assert wal.finish_rotations(timeout=10)


def _frame(i):
    from danube import message_codec

    return message_codec.encode_payloads([b"%06d" % i + b"." * 194])


def test_prune_waits_for_the_file_to_be_final(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, sync="always", cache_bytes=0)
    _fill(wal, 120)
    files = wal.rotated_files()
    pruned = wal.prune_through(files[0].last_offset)
    assert pruned == files[:1] and not os.path.exists(files[0].path)
    assert files[0].seq not in read_checkpoint(str(tmp_path / "w")).rotated
    assert wal.read(files[1].first_offset)[0].offset == files[1].first_offset


def test_record_bigger_than_the_spare(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=4096, sync="always")
    _spare_ahead(wal)
    wal.append(b"small")
    big = os.urandom(20000)
    offset = wal.append(big)
    assert bytes(wal.read(offset)[0].payload) == big
    assert wal.append(b"next") == offset + 1
    seqs = [f.seq for f in wal.rotated_files()] + [wal._writer.segment.seq]
    assert seqs == sorted(seqs)  # the discarded spare's seq never comes after a newer file
    wal.close()
    with Wal.open(tmp_path / "w", sync="never") as again:
        assert [bytes(r.payload) for r in again.read(0)] == [b"small", big, b"next"]


def test_listener_errors_do_not_stop_rotation(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192)
    seen = []

    def bad(_info):
        raise RuntimeError("listener bug")

    wal.add_rotation_listener(bad)
    wal.add_rotation_listener(seen.append)
    _fill(wal, 120)
    assert wal.finish_rotations(timeout=10)
    assert seen == wal.rotated_files() and len(seen) >= 2


# ---------------------------------------------------------------- sync=interval cadence


async def test_interval_answers_a_waiter_as_soon_as_always_would(open_wal, tmp_path):
    """A waiter under sync=interval is never held for the budget: its sync starts as soon as the
    group is free, as under always (the budget paces only what nobody waits on)."""
    interval = 0.4
    wal = open_wal(tmp_path / "w", sync="interval", sync_interval_ms=interval * 1000)

    async def timed_wait(payload: bytes) -> float:
        offset = wal.append(payload)
        t0 = time.monotonic()
        await wal.wait_durable(offset)
        return time.monotonic() - t0

    waits = [await timed_wait(b"%d" % i) for i in range(4)]
    # the budget would have held the third and fourth for the schedule (an interval apart)
    assert max(waits) < interval / 2, waits
    assert sum(waits) < interval, waits


async def test_interval_paces_appends_nobody_waits_for_at_one_sync_per_interval(open_wal, tmp_path):
    interval = 0.1
    wal = open_wal(tmp_path / "w", sync="interval", sync_interval_ms=interval * 1000)
    await asyncio.sleep(interval * 1.2)
    syncs_before = wal.sync_count
    t0 = time.monotonic()
    last = -1
    while time.monotonic() - t0 < interval * 8:  # an append every few ms, nobody waiting
        last = wal.append(b"x")
        await asyncio.sleep(0.003)
    await async_wait_until(lambda: wal.durable_offset >= last, 10, "the last append synced", 0.005)
    elapsed = time.monotonic() - t0
    syncs = wal.sync_count - syncs_before
    # the first sync is due at once; after it, one per interval and two ahead of the schedule at most
    assert 4 <= syncs <= elapsed / interval + 2, (syncs, elapsed)
