"""Disk follows use: files are sparse at their full size, reserved in doubling steps
ahead of the writer, a spare only once the log rotated; recovery over sparse tails."""

from __future__ import annotations

import os
import shutil

from danube.wal import Wal
from danube.wal.files import list_segment_files
from tests.support.waiting import wait_until

KiB, MiB = 1024, 1024 * 1024


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


def _logs(d):
    return [p for _s, p in list_segment_files(str(d))]


def test_a_new_log_reserves_a_little_and_grows_in_steps(tmp_path):
    d = tmp_path / "w"
    with Wal.open(d, sync="always", max_file_bytes=8 * MiB) as wal:
        (path,) = _logs(d)
        assert os.path.getsize(path) == 8 * MiB  # mapped whole ...
        assert _allocated(path) <= 256 * KiB  # ... reserved 256 KiB
        seg = wal._writer.segment
        assert (seg.capacity, seg.map_size) == (256 * KiB, 8 * MiB)
        for _ in range(3000):  # ~1.1 MiB
            wal.append_batch([b"r" * 300])
        assert _logs(d) == [path]  # grew, no rotation, no spare
        assert 1 * MiB <= seg.capacity <= 4 * MiB
        assert _allocated(path) <= seg.capacity
        assert wal._keeper._spare is None
        for _ in range(30):  # past 8 MiB: rotates
            wal.append_batch([b"x" * 1000] * 300)
        wal.finish_rotations()
        assert len(wal.rotated_files()) >= 1
    with Wal.open(d, sync="never") as again:
        assert again.next_offset == 3000 + 30 * 300


def test_spare_after_rotation_reserves_what_the_old_file_needed(tmp_path):
    d = tmp_path / "w"
    with Wal.open(d, sync="interval", max_file_bytes=1 * MiB) as wal:
        while not wal.rotated_files():
            wal.append_batch([b"y" * 1000] * 50)
        wal.finish_rotations()
        spare = wait_until(lambda: wal._keeper._spare, 10, "the keeper's spare file", 0.01)
        assert spare.capacity == 1 * MiB  # a hot log's spare: reserved whole


def test_a_record_bigger_than_the_reservation(tmp_path):
    d = tmp_path / "w"
    big = os.urandom(3 * MiB)
    with Wal.open(d, sync="always", max_file_bytes=64 * MiB) as wal:
        wal.append(b"small")
        assert wal.append(big) == 1
        assert bytes(wal.read(1)[0].payload) == big
        assert not wal.rotated_files()


def test_crash_recovery_over_a_sparse_tail_with_garbage(tmp_path):
    d = tmp_path / "w"
    wal = Wal.open(d, sync="always", max_file_bytes=16 * MiB)
    payloads = [os.urandom(200) for _ in range(500)]
    for p in payloads:
        wal.append(p)
    crash = tmp_path / "crash"
    shutil.copytree(d, crash, ignore=shutil.ignore_patterns("wal.lock"))
    (path,) = _logs(crash)
    # garbage after the data: in the reserved part and far out in the hole
    with open(path, "r+b") as f:
        f.seek(wal._writer.segment.write_pos + 17)
        f.write(b"\xffgarbage")
        f.seek(9 * MiB + 5)
        f.write(b"\xee" * 100)
    with Wal.open(crash, sync="always", max_file_bytes=16 * MiB) as again:
        assert again.next_offset == len(payloads)
        assert sum(t[2] for t in again.recovery.trimmed) >= 100
        assert [bytes(r.payload) for r in again.read(0)] == payloads
        assert again.append(b"after") == len(payloads)
        again.append_batch([b"z" * 1000] * 2000)  # grows through the zeroed region
        assert again.read(len(payloads))[0].payload == b"after"
    with open(path, "rb") as f:
        f.seek(9 * MiB + 5)
        assert f.read(100) in (b"\0" * 100, b"z" * 100) or b"\xee" not in f.read(100)
    wal.close()


def test_sync_never_prefault_window_changes_no_byte(tmp_path):
    """sync=never writes zeros ahead of the writer (then maps them): never over a frame,
    never beyond the reservation or the file's size; mixed with pwritten batches and a
    reopen, every record reads back and the file past the last frame is zeros."""
    d = tmp_path / "w"
    want = []
    with Wal.open(d, sync="never", max_file_bytes=16 * MiB) as wal:
        (path,) = _logs(d)
        for i in range(5000):
            want.append(b"a%d" % i * 7)
            wal.append(want[-1], key="k" if i % 3 else None)
            if i % 997 == 0:  # >= 16 KiB: the pwrite path
                batch = [b"b%d" % i * 300] * 20
                wal.append_batch(batch)
                want.extend(batch)
        seg = wal._writer.segment
        assert os.path.getsize(path) == 16 * MiB
        assert _allocated(path) <= seg.capacity + 64 * KiB
        end = seg.write_pos
    with Wal.open(d, sync="never", max_file_bytes=16 * MiB) as wal:
        assert [bytes(r.payload) for r in wal.read(0)] == want
        for _ in range(3000):  # the reopened file: a window from its end
            wal.append(b"c" * 100)
            want.append(b"c" * 100)
        end = wal._writer.segment.write_pos
        assert [bytes(r.payload) for r in wal.iter(0)] == want
    with open(path, "rb") as f:
        f.seek(end)
        assert f.read(1 * MiB).count(0) == 1 * MiB
