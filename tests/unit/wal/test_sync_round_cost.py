"""What a sync round and a durability wait cost per log (durability at many topics): a
syncfs round locks each log once for its sync, answers and chore; a wait on a log already asked
for asks the group nothing more; a sync=always log's appends are the writer's own method."""

from __future__ import annotations

import asyncio
import threading

import pytest

from danube import message_codec
from danube.wal import Wal
from danube.wal import sync_group as sync_mod
from danube.wal.sync import SyncGroup


class _CountingLock:
    """A log's lock that counts its acquisitions (the keeper keeps the real one: same lock)."""

    def __init__(self, lock) -> None:
        self._lock = lock
        self.acquired = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        self.acquired += got
        return got

    def release(self) -> None:
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _frames(payload: bytes) -> bytearray:
    return bytearray(message_codec.encode_payloads([payload, payload]))


def _manual_group(name: str, **kwargs) -> SyncGroup:
    """A group whose own thread never starts: the test runs its rounds."""
    group = SyncGroup(name=name, **kwargs)
    group._thread = threading.current_thread()
    return group


@pytest.mark.skipif(sync_mod._syncfs is None, reason="syncfs is not available here")
def test_a_syncfs_round_locks_each_log_once_and_answers_every_waiter(tmp_path, monkeypatch):
    group = _manual_group("danube-wal-test-one-pass", syncfs_min_logs=4)
    logs = [Wal.open(tmp_path / f"log{i}", sync_group=group, sync="always") for i in range(6)]
    locks = []
    for wal in logs:
        lock = _CountingLock(wal._syncer._lock)
        wal._syncer._lock = lock
        locks.append(lock)
    real_syncfs = sync_mod._syncfs

    def syncfs_with_an_append(fd: int) -> None:
        real_syncfs(fd)
        logs[0].append_frames(_frames(b"during"))  # appended while the round runs

    monkeypatch.setattr(sync_mod, "_syncfs", syncfs_with_an_append)

    async def run() -> list:
        loop = asyncio.get_running_loop()
        answers: list = []
        lasts = [wal.append_frames(_frames(f"m{i}".encode()))[1] for i, wal in enumerate(logs)]
        for wal, last in zip(logs, lasts):
            wal.when_durable(last, answers.append)
        assert set(group._urgent) == {wal._syncer for wal in logs}
        await loop.run_in_executor(None, lambda: group._round(group._next_round()))
        for _ in range(3):
            await asyncio.sleep(0)
        for wal, last in zip(logs, lasts):
            assert wal.durable_offset >= last
        return answers

    try:
        answers = asyncio.run(run())
        assert answers == [None] * len(logs)
        assert group.fs_syncs == 1 and group.rounds == 1
        # one acquire per log for its target, its syncfs, its waiters and its chore
        assert [lock.acquired for lock in locks] == [1] * len(logs)
        # the log appended to during the round is asked for again (and only that one)
        assert list(group._urgent) == [logs[0]._syncer]
        assert all(not wal._syncer._waiters for wal in logs)
    finally:
        for wal in logs:
            wal._syncer._lock = wal._syncer.lock
            wal.close()


def test_a_wait_on_a_log_already_asked_for_does_not_ask_again(tmp_path, monkeypatch):
    group = _manual_group("danube-wal-test-asked", syncfs_min_logs=0)
    wal = Wal.open(tmp_path / "log", sync_group=group, sync="always")
    asked: list = []
    real_request = group.request

    def request(syncer) -> None:
        asked.append(syncer)
        real_request(syncer)

    monkeypatch.setattr(group, "request", request)

    async def run() -> list:
        answers: list = []
        _first, last1 = wal.append_frames(_frames(b"a"))
        wal.when_durable(last1, answers.append)
        _first, last2 = wal.append_frames(_frames(b"b"))
        wal.when_durable(last2, answers.append)
        assert asked == [wal._syncer]  # the second wait found the log asked for already
        await asyncio.get_running_loop().run_in_executor(None, lambda: group._round(group._next_round()))
        for _ in range(3):
            await asyncio.sleep(0)
        assert wal.durable_offset >= last2
        # once the round took the request, a new wait asks again
        _first, last3 = wal.append_frames(_frames(b"c"))
        wal.when_durable(last3, answers.append)
        assert asked == [wal._syncer, wal._syncer]
        await asyncio.get_running_loop().run_in_executor(None, lambda: group._round(group._next_round()))
        for _ in range(3):
            await asyncio.sleep(0)
        return answers

    try:
        assert asyncio.run(run()) == [None, None, None]
    finally:
        wal.close()


def test_a_syncfs_answers_only_the_waiters_it_covers_whatever_their_order(tmp_path):
    group = _manual_group("danube-wal-test-order", syncfs_min_logs=4)
    wal = Wal.open(tmp_path / "log", sync_group=group, sync="always")
    syncer = wal._syncer
    loop = object()
    high, low = (lambda exc: None), (lambda exc: None)
    syncer._waiters = [(9, loop, high), (2, loop, low), (5, loop, high)]
    ready: list = []
    try:
        with syncer._lock:
            syncer._fs_synced(5, 0.1, syncer.latency.bucket(0.1), ready)
        assert ready == [(loop, low), (loop, high)]
        assert syncer._waiters == [(9, loop, high)] and syncer._durable == 5
        assert syncer.sync_count == 1 and syncer.latency.count == 1
    finally:
        syncer._waiters = []
        syncer._durable = wal.next_offset - 1  # (nothing was synced: the last sync at close does it)
        wal.close()


def test_sync_always_appends_frames_through_the_writer_itself(tmp_path):
    """Frame batches never wait for the disk on append (the commit waits for durability): no
    wrapper per publish under sync=always either."""
    wal = Wal.open(tmp_path / "log", sync="always")
    try:
        assert wal.append_frames == wal._writer.append_frames
        assert "append" not in wal.__dict__  # ``append`` outside a loop syncs: the class's method
        first, last = wal.append_frames(_frames(b"x"))
        assert (first, last) == (0, 1) and wal.durable_offset < last
        assert wal.sync() == last
    finally:
        wal.close()
