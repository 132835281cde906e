"""Wal.stop_writing: the directory (its lock) is given up, what was stored stays readable.

What a broker cut off from etcd does once its lease may have expired: the next owner of the topic
opens the same WAL directory (shared_fs) and continues the log while the old owner's consumers
still read the offsets it stored."""

from __future__ import annotations

import pytest

from danube import message_codec
from danube.errors import WalBusyError, WalClosedError
from danube.wal import Wal


def _payloads(wal: Wal, start: int, end: int) -> list[bytes]:
    return [bytes(r.payload) for r in wal.read(start, max_records=end - start)]


@pytest.mark.parametrize("suspended", [False, True], ids=["open", "suspended"])
@pytest.mark.parametrize("sync", ["always", "never"])
def test_stop_writing_frees_the_directory_and_keeps_the_stored_offsets_readable(tmp_path, sync, suspended):
    d = tmp_path / "wal"
    kept = 0
    old = Wal.open(d, sync=sync, max_file_bytes=16 << 10)
    try:
        for i in range(600):  # several rotated files and an active one
            old.append(b"old-%04d" % i + b"." * 60)
        assert len(old.rotated_files()) >= 2
        with pytest.raises(WalBusyError):
            Wal.open(d, sync=sync)
        if suspended:
            old.finish_rotations()
            assert old.suspend()
        assert old.stop_writing() == 599
        assert old.read_only and not old.closed and "read-only" in repr(old)
        # the next owner opens it at once and continues the same files
        new = Wal.open(d, sync=sync, max_file_bytes=16 << 10)
        try:
            assert new.next_offset == 600
            for i in range(400):
                new.append(b"new-%04d" % i + b"." * 60)
            new.rotate()
            new.finish_rotations()
            pruned = new.prune_through(299)  # the new owner's retention removes files the old one maps
            assert pruned
            kept = pruned[-1].last_offset + 1
            # the old one still reads every offset it stored, and only those
            assert _payloads(old, 0, 600) == [b"old-%04d" % i + b"." * 60 for i in range(600)]
            assert old.read_frames(600) == b""
            assert old.next_offset == 600
            # it writes nothing: appends, rotation, pruning, syncs and suspends refuse
            with pytest.raises(WalClosedError, match="read-only"):
                old.rotate()
            with pytest.raises(WalClosedError):
                old.append(b"zombie")
            with pytest.raises(WalClosedError):
                old.append_frames(bytearray(message_codec.encode_payloads([b"zombie"])))
            with pytest.raises(WalClosedError, match="read-only"):
                old.prune_through(500)
            with pytest.raises(WalClosedError, match="read-only"):
                old.sync()
            with pytest.raises(WalClosedError):
                old.stop_writing()
            assert not old.suspend()
            old.close()
            with pytest.raises(WalClosedError):
                old.read_frames(0)
            assert new.next_offset == 1000
            assert new.first_offset == kept
            assert [r.offset for r in new.read(kept)] == list(range(kept, 1000))
        finally:
            new.close()
        # nothing the read-only owner did (or its close) damaged the log
        with Wal.open(d, sync=sync) as again:
            assert (again.first_offset, again.next_offset) == (kept, 1000)
            assert _payloads(again, kept, 600) == [b"old-%04d" % i + b"." * 60 for i in range(kept, 600)]
            assert _payloads(again, 600, 1000) == [b"new-%04d" % i + b"." * 60 for i in range(400)]
    finally:
        old.close()


def test_stop_writing_a_closed_log_is_an_error(tmp_path):
    wal = Wal.open(tmp_path / "wal", sync="never")
    wal.append(b"x")
    wal.close()
    with pytest.raises(WalClosedError):
        wal.stop_writing()
