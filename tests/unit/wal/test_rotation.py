"""Rotation by size and age, the checkpoint, pruning, reopen."""

from __future__ import annotations

import json
import os
import time

from danube.wal import Wal
from danube.wal.checkpoint import read_checkpoint
from danube.wal.files import list_segment_files


def _has_header(path):
    with open(path, "rb") as f:
        return any(f.read(64))


def _fill(wal, n, size=200):
    for i in range(n):
        wal.append(b"%06d" % i + b"." * (size - 6))


def test_size_rotation_and_checkpoint(open_wal, tmp_path):
    rotations = []
    wal = open_wal(tmp_path / "w", max_file_bytes=8192)
    wal.add_rotation_listener(rotations.append)
    _fill(wal, 200)
    files = wal.rotated_files()
    assert wal.finish_rotations(timeout=10)  # listeners run once a file is final, in the background
    assert len(files) >= 4 and files == rotations
    for prev, cur in zip(files, files[1:]):
        assert cur.first_offset == prev.last_offset + 1 and cur.seq > prev.seq  # a seq may be skipped
    for info in files:
        assert os.path.getsize(info.path) == info.size <= 8192
        assert info.size > info.data_start
    ckpt = read_checkpoint(str(tmp_path / "w"))
    assert sorted(ckpt.rotated) == [f.seq for f in files]
    assert [r.offset for r in wal.read(0)] == list(range(200))


def test_reopen_trusts_checkpointed_files_and_reads_them(tmp_path):
    with Wal.open(tmp_path / "w", max_file_bytes=8192, sync="never") as wal:
        _fill(wal, 200)
        rotated = wal.rotated_files()
    with Wal.open(tmp_path / "w", max_file_bytes=8192, sync="never") as wal:
        assert wal.rotated_files() == rotated
        on_disk = {p for _s, p in list_segment_files(str(tmp_path / "w")) if _has_header(p)}  # not the spare
        assert set(wal.recovery.scanned_files) == on_disk - {r.path for r in rotated}
        assert [bytes(r.payload)[:6] for r in wal.read(0)] == [b"%06d" % i for i in range(200)]
        assert wal.next_offset == 200


def test_reopen_without_checkpoint_scans_everything(tmp_path):
    with Wal.open(tmp_path / "w", max_file_bytes=8192, sync="never") as wal:
        _fill(wal, 120)
    os.unlink(tmp_path / "w" / "wal.ckpt")
    with Wal.open(tmp_path / "w", max_file_bytes=8192, sync="never") as wal:
        assert not wal.recovery.checkpoint_found
        assert wal.next_offset == 120 and wal.first_offset == 0
        assert len(wal.read(0)) == 120


def test_damaged_checkpoint_is_ignored(tmp_path):
    with Wal.open(tmp_path / "w", max_file_bytes=8192, sync="never") as wal:
        _fill(wal, 80)
    path = tmp_path / "w" / "wal.ckpt"
    obj = json.loads(path.read_bytes())
    obj["first_offset"] = 77  # crc no longer matches
    path.write_text(json.dumps(obj))
    with Wal.open(tmp_path / "w", sync="never") as wal:
        assert not wal.recovery.checkpoint_found
        assert wal.first_offset == 0 and wal.next_offset == 80


def test_prune_through(open_wal, tmp_path):
    wal = open_wal(tmp_path / "w", max_file_bytes=8192, cache_bytes=0)
    _fill(wal, 200)
    files = wal.rotated_files()
    cut = files[1].last_offset
    pruned = wal.prune_through(cut + 1)  # the third file still holds cut + 2..: kept
    assert pruned == files[:2]
    assert not any(os.path.exists(f.path) for f in pruned)
    assert wal.first_offset == cut + 1
    assert wal.read(cut + 1)[0].offset == cut + 1
    import pytest

    from danube.errors import OffsetOutOfRangeError

    with pytest.raises(OffsetOutOfRangeError):
        wal.read(0)
    wal.close()
    with Wal.open(tmp_path / "w", sync="never") as again:
        assert again.first_offset == cut + 1 and again.next_offset == 200


def test_age_rotation(open_wal):
    wal = open_wal(max_file_age_s=0.4)
    wal.append(b"a")
    assert wal.maybe_rotate() is None
    time.sleep(0.45)
    wal.append(b"b")  # the active file is too old: rotated before this append
    assert [(f.first_offset, f.last_offset) for f in wal.rotated_files()] == [(0, 0)]
    time.sleep(0.45)
    info = wal.maybe_rotate()
    assert (info.first_offset, info.last_offset) == (1, 1)


def test_record_larger_than_a_file(open_wal):
    wal = open_wal(max_file_bytes=4096)
    big = os.urandom(20000)
    wal.append(b"small")
    offset = wal.append(big)
    assert bytes(wal.read(offset)[0].payload) == big


def test_explicit_rotate_and_empty_rotate(open_wal):
    wal = open_wal()
    assert wal.rotate() is None
    wal.append(b"x")
    info = wal.rotate()
    assert (info.first_offset, info.last_offset) == (0, 0)
    assert wal.append(b"y") == 1
