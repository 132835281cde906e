"""Corruption: flipped bits, torn frames, garbage; reopen recovers to the last good frame."""

from __future__ import annotations

import os

import pytest

from danube import message_codec
from danube.errors import CorruptFrameError, OffsetOutOfRangeError, WalError
from danube.wal import Wal
from danube.wal.files import list_segment_files

HEADER = 64


def _write(path, n=10, **options):
    options.setdefault("sync", "never")
    with Wal.open(path, **options) as wal:
        for i in range(n):
            wal.append(b"record-%03d" % i + b"-" * 50)
    return list_segment_files(str(path))


def _frame_positions(path):
    data = open(path, "rb").read()
    count, end, *_ = message_codec.scan(data, HEADER)
    return message_codec.frame_positions(data[HEADER:end])


def _patch(path, pos, data):
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, data, pos)
    os.close(fd)


@pytest.mark.parametrize("where", ["flip", "truncate", "garbage", "zero_header_torn"])
def test_bad_tail_is_trimmed_to_last_good_frame(tmp_path, where):
    path = tmp_path / "w"
    ((_seq, file),) = _write(path)
    positions = [HEADER + p for p in _frame_positions(file)]
    size = os.path.getsize(file)
    if where == "flip":  # a flipped bit inside frame 7's payload
        pos = positions[7] + 40
        byte = open(file, "rb").read()[pos]
        _patch(file, pos, bytes([byte ^ 0x10]))
        good = 7
    elif where == "truncate":  # the file ends in the middle of frame 9
        os.truncate(file, positions[9] + 20)
        good = 9
    elif where == "garbage":  # junk written after the last frame
        end = positions[9] + (positions[9] - positions[8])
        _patch(file, end, os.urandom(100))
        good = 10
    else:  # a frame whose header never hit the disk but whose body did
        _patch(file, positions[8], bytes(16))
        good = 8
    with Wal.open(path, sync="never") as wal:
        assert wal.next_offset == good
        assert [bytes(r.payload)[:10] for r in wal.read(0)] == [b"record-%03d" % i for i in range(good)]
        end = positions[good] if good < 10 else positions[9] + (positions[9] - positions[8])
        assert wal.recovery.trimmed and wal.recovery.trimmed[0][1] == end
        with pytest.raises(OffsetOutOfRangeError):
            wal.read(good + 1)
        assert wal.append(b"after") == good  # appends continue after the last good frame
    with Wal.open(path, sync="never") as wal:
        records = wal.read(0)
        assert [r.offset for r in records] == list(range(good + 1))
        assert bytes(records[-1].payload) == b"after"
        assert not wal.recovery.trimmed
    if where != "truncate":
        assert os.path.getsize(file) == size  # trimmed by zeroing, the preallocation stays


def test_corruption_in_a_rotated_file_is_reported_on_read(tmp_path):
    path = tmp_path / "w"
    files = _write(path, n=200, max_file_bytes=4096, cache_bytes=0)
    assert len(files) > 2
    seq, file = files[0]
    positions = [HEADER + p for p in _frame_positions(file)]
    _patch(file, positions[-1] + 30, b"\xff\xff")
    with Wal.open(path, sync="never", cache_bytes=0) as wal:
        assert wal.first_offset == 0 and wal.next_offset == 200  # the checkpoint vouches for the file
        good = len(positions) - 1
        assert [r.offset for r in wal.read(0, max_records=good)] == list(range(good))
        with pytest.raises(CorruptFrameError) as info:
            wal.read(0)
        assert info.value.path == file and info.value.offset == good
        later = wal.read(len(positions))  # nothing after the damaged file is lost
        assert later[0].offset == len(positions) and later[-1].offset == 199


def test_bad_file_header_fails_loudly(tmp_path):
    path = tmp_path / "w"
    ((_seq, file),) = _write(path)
    _patch(file, 20, b"\x01")
    with pytest.raises(CorruptFrameError):
        Wal.open(path)
    assert os.path.getsize(file) > HEADER  # nothing was deleted


def test_missing_middle_file_fails_loudly(tmp_path):
    path = tmp_path / "w"
    files = _write(path, n=200, max_file_bytes=4096)
    os.unlink(files[1][1])
    os.unlink(path / "wal.ckpt")
    with pytest.raises(WalError):
        Wal.open(path)


def test_file_created_but_never_written_is_dropped(tmp_path):
    path = tmp_path / "w"
    _write(path, n=5)
    empty = path / "wal-00000000000000000099.log"
    empty.write_bytes(bytes(4096))
    with Wal.open(path, sync="never") as wal:
        assert wal.next_offset == 5
        assert str(empty) in wal.recovery.removed_empty
        assert wal.append(b"x") == 5
