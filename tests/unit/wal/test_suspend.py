"""Suspending an idle WAL: files, mappings, threads and cache released, reopened on next use."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading

import pytest

from danube.errors import WalClosedError
from danube.wal import Wal, rotation
from danube.wal import sync as sync_mod


def _open_fds_under(path: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(os.path.abspath(path)):
            out.append(target)
    return out


def _wal_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("danube-wal"))


# Threads shared by every log of the process, started on demand: the sync group's, its round
# workers, the file workers.  A log has none of its own (open or suspended).
_SHARED_WAL_THREADS = 1 + sync_mod.ROUND_WORKERS + rotation.FILE_WORKERS.size


def _allocated(path: str) -> int:
    return sum(os.stat(os.path.join(path, n)).st_blocks * 512 for n in os.listdir(path))


@pytest.mark.parametrize("sync", ["always", "never"])
def test_suspend_releases_and_reopens_on_append(tmp_path, sync):
    d = tmp_path / "wal"
    with Wal.open(d, sync=sync, max_file_bytes=64 << 10) as wal:
        for i in range(2000):
            wal.append(b"x" * 100, key=str(i))
        assert wal.rotated_files()
        wal.finish_rotations()
        first, nxt = wal.first_offset, wal.next_offset
        assert wal.suspend()
        assert wal.suspended and not wal.suspend()
        if wal._dormant.released is not None:
            assert wal._dormant.released.wait(10)  # the tail release holds a dup of the fd until done
        assert _open_fds_under(str(d)) == [os.path.join(str(d), "wal.lock")]
        assert _wal_threads() <= _SHARED_WAL_THREADS
        assert not wal._keeper._scheduled  # no file work left queued for it
        # state still answers without reopening
        assert (wal.first_offset, wal.next_offset) == (first, nxt)
        assert wal.rotated_files() and wal.suspended
        assert wal.read_frames(nxt) == b"" and wal.suspended
        # a read below the end reopens
        assert bytes(wal.read(5, max_records=1)[0].payload) == b"x" * 100
        assert not wal.suspended and wal.resume_count == 1
        assert wal.suspend()
        # an append reopens and continues the offsets
        assert wal.append(b"after") == nxt
        assert not wal.suspended
        assert [bytes(r.payload) for r in wal.read(nxt)] == [b"after"]
        assert wal.read(0, max_records=1)[0].routing_key == "0"
    assert _wal_threads() <= _SHARED_WAL_THREADS


def test_suspend_gives_back_the_preallocated_tail(tmp_path):
    d = tmp_path / "wal"
    with Wal.open(d, sync="interval", max_file_bytes=8 << 20) as wal:
        wal.append(b"y" * 1000)
        wal.sync()
        wal.suspend()
        wal._dormant.released.wait(10)  # the truncates run on a background thread
        assert _allocated(str(d)) <= 256 << 10
        wal.append(b"z")
        assert [bytes(r.payload) for r in wal.read(0)] == [b"y" * 1000, b"z"]


def test_tail_reader_waits_across_suspend():
    async def main(path):
        wal = Wal.open(path, sync="never")
        wal.append(b"a")
        got = []

        async def follow():
            async for rec in wal.tail(from_offset=0):
                got.append(bytes(rec.payload))
                if len(got) == 3:
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.01)
        assert wal.suspend()
        await asyncio.sleep(0.01)
        wal.append(b"b")
        wal.append(b"c")
        await asyncio.wait_for(task, 5)
        wal.close()
        return got

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert asyncio.run(main(os.path.join(tmp, "w"))) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("cut", [False, True])
def test_crash_recovery_of_a_log_suspended_while_idle(tmp_path, cut):
    """A crash (the directory copied as the process left it) while suspended loses nothing;
    ``cut``: the crash fell between the two truncates that give back the preallocated tail."""
    d = tmp_path / "wal"
    wal = Wal.open(d, sync="always", max_file_bytes=32 << 10)
    payloads = [os.urandom(50 + i % 200) for i in range(600)]
    for p in payloads:
        wal.append(p)
    wal.suspend()
    crash = tmp_path / "crash"
    shutil.copytree(d, crash, ignore=shutil.ignore_patterns("wal.lock"))
    if cut:
        newest = sorted(n for n in os.listdir(crash) if n.endswith(".log"))[-1]
        path = crash / newest
        with open(path, "rb") as f:
            data = f.read()
        end = len(data.rstrip(b"\0"))
        os.truncate(path, -(-end // 4096) * 4096)
    with Wal.open(crash, sync="always", max_file_bytes=32 << 10) as again:
        assert again.next_offset == len(payloads)
        assert [bytes(r.payload) for r in again.read(0)] == payloads
        assert again.append(b"more") == len(payloads)
    wal.close()
    with pytest.raises(WalClosedError):
        wal.append(b"closed")


def test_close_while_suspended(tmp_path):
    d = tmp_path / "wal"
    wal = Wal.open(d, sync="interval")
    wal.append(b"1")
    wal.suspend()
    wal.close()
    assert wal.closed
    with Wal.open(d) as again:
        assert again.next_offset == 1


def test_running_out_of_descriptors_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    code = f"""
import resource, os
from danube.errors import TooManyOpenFilesError
from danube.wal import Wal
from danube.server.limits import raise_nofile_limit
wals = []
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    for i in range(100):
        wals.append(Wal.open(os.path.join({str(tmp_path)!r}, str(i)), sync="never"))
except TooManyOpenFilesError as exc:
    assert exc.retriable and "RLIMIT_NOFILE soft 64" in str(exc) and "idle_close_seconds" in str(exc), exc
    print("clear", len(wals))
# suspending idle logs gives descriptors back: one each is left
for w in wals:
    w.suspend()
more = [Wal.open(os.path.join({str(tmp_path)!r}, "x" + str(i)), sync="never") for i in range(5)]
soft, hard = raise_nofile_limit()
assert soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20) or soft == -1
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clear" in out.stdout and out.stdout.strip().endswith("ok")


def test_resume_listeners_hear_every_reopen(tmp_path):
    """Each reopen (by an append, by a read on another thread) calls the resume listeners once,
    on the thread that reopened it; a failing listener neither stops the others nor the reopen."""
    heard: list[str] = []

    def bad():
        raise RuntimeError("listener bug")

    with Wal.open(tmp_path / "wal", sync="always") as wal:
        wal.add_resume_listener(bad)
        wal.add_resume_listener(lambda: heard.append(threading.current_thread().name))
        offset = wal.append(b"one")
        assert wal.suspend() and heard == []
        assert wal.append(b"two") == offset + 1
        assert heard == [threading.current_thread().name] and wal.resume_count == 1
        assert wal.suspend()
        reader = threading.Thread(target=lambda: wal.read(offset), name="a-reader")
        reader.start()
        reader.join(10)
        assert heard[1:] == ["a-reader"] and wal.resume_count == 2
        assert not wal.suspended
        # no reopen, no call: an open log, a read at the end of a suspended one
        wal.append(b"three")
        assert wal.suspend()
        assert wal.read_frames(wal.next_offset) == b""
        assert len(heard) == 2
