"""danube/wal/sync.py across logs: one group commit per round for every log with something to sync,
no thread per log, nothing done for idle logs."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.wal import Wal
from danube.wal import sync_group as sync_mod
from danube.wal.sync import SyncGroup
from tests.support.waiting import async_wait_until, wait_until


def _open_logs(tmp_path, n, group, **options):
    return [Wal.open(tmp_path / f"log{i}", sync_group=group, **options) for i in range(n)]


def _wal_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("danube-wal")]


async def _append_and_wait_all(logs, rounds=5):
    for r in range(rounds):
        lasts = [wal.append_frames(_frames(f"r{r}-{i}".encode())) for i, wal in enumerate(logs)]
        await asyncio.wait_for(asyncio.gather(*(wal.wait_durable(last) for wal, (_f, last) in zip(logs, lasts))), 30)
        for wal, (_first, last) in zip(logs, lasts):
            assert wal.durable_offset >= last


def _frames(payload: bytes) -> bytearray:
    from danube import message_codec

    return bytearray(message_codec.encode_payloads([payload, payload]))


@pytest.mark.parametrize("syncfs_min_logs", [4, 0], ids=["syncfs", "per-file"])
@pytest.mark.parametrize("sync", ["always", "interval"])
def test_every_waiter_of_many_logs_is_answered_by_shared_rounds(tmp_path, sync, syncfs_min_logs):
    group = SyncGroup(syncfs_min_logs=syncfs_min_logs, name=f"danube-wal-test-{sync}")
    logs = _open_logs(tmp_path, 12, group, sync=sync)
    try:
        asyncio.run(_append_and_wait_all(logs))
        # 12 logs x 5 appends were made durable in far fewer rounds than log syncs
        assert group.synced_logs >= 12 * 5
        assert group.rounds < group.synced_logs / 4
        if syncfs_min_logs and sync_mod._syncfs is not None:
            assert group.fs_syncs >= 1
        elif not syncfs_min_logs:
            assert group.fs_syncs == 0
        # each log's syncs (its own or its share of a syncfs) are timed, and so is each round
        # (a round may be finishing on the group's thread: one of each may not be counted yet)
        assert all(wal.sync_count >= 1 and abs(wal.flush_latency.count - wal.sync_count) <= 1 for wal in logs)
        assert group.rounds - 1 <= group.round_latency.count <= group.rounds
    finally:
        for wal in logs:
            wal.close()
    for i, wal in enumerate(logs):  # what was acknowledged is there after reopening
        with Wal.open(tmp_path / f"log{i}", sync_group=group, sync=sync) as again:
            assert again.next_offset == 10
            assert bytes(again.read(8)[0].payload) == f"r4-{i}".encode()


def test_threads_do_not_grow_with_the_number_of_logs(tmp_path):
    before = len(_wal_threads())
    logs = _open_logs(tmp_path, 24, None, sync="always", max_file_bytes=64 * 1024, initial_file_bytes=8192)
    try:
        for wal in logs:  # every log rotates a few times (file work) and waits for the disk
            for _ in range(3):
                wal.append_batch([b"x" * 20_000])
        asyncio.run(_append_and_wait_all(logs, rounds=2))
        # one group thread + at most its 3 round workers + 2 file workers, whatever the log count
        assert len(_wal_threads()) - before <= 6, _wal_threads()
    finally:
        for wal in logs:
            wal.close()


def test_interval_syncs_appends_nobody_waits_for_and_idle_logs_cost_no_rounds(tmp_path):
    group = SyncGroup(name="danube-wal-test-idle")
    logs = _open_logs(tmp_path, 6, group, sync="interval", sync_interval_ms=5)
    try:
        for wal in logs:
            wal.append(b"unwaited")  # no wait_durable: the append hook tells the group
        wait_until(lambda: all(wal.durable_offset == 0 for wal in logs), 10, "every log synced", 0.01)
        wait_until(lambda: not group._urgent and not any(group._paced.values()), 10, "nothing pending", 0.01)
        rounds = group.rounds
        time.sleep(0.3)  # sixty intervals of nothing to sync
        assert group.rounds == rounds
        logs[2].append(b"again")
        wait_until(lambda: logs[2].durable_offset == 1, 10, "the new append synced", 0.01)
        assert group.rounds > rounds
    finally:
        for wal in logs:
            wal.close()


def test_a_log_that_closes_leaves_the_group_and_the_others_go_on(tmp_path):
    group = SyncGroup(name="danube-wal-test-close")
    logs = _open_logs(tmp_path, 5, group, sync="always")
    logs[0].close()
    try:
        asyncio.run(_append_and_wait_all(logs[1:], rounds=2))
    finally:
        for wal in logs[1:]:
            wal.close()


def test_a_log_with_a_rotated_file_not_yet_synced_syncs_its_own_files(tmp_path):
    """The syncfs round vouches for the file system as of its start; a log whose rotated file or
    directory entry still needs an fsync of its own does it itself (the bookkeeping stays exact)."""
    group = SyncGroup(name="danube-wal-test-rotated")
    with Wal.open(tmp_path / "log", sync="always", sync_group=group) as wal:
        assert wal._fs_sync_target() == (wal._device, wal._lock_fd)
        keeper = wal._keeper
        keeper.dir_dirty = True
        assert wal._fs_sync_target() is None
        wal.append(b"x")  # outside a loop: synced on this thread, directory too
        assert keeper.dir_dirty is False
        assert wal._fs_sync_target() is not None


@pytest.mark.parametrize("syncfs_min_logs", [4, 0], ids=["syncfs", "per-file"])
def test_a_log_whose_lock_is_taken_does_not_hold_up_the_others(tmp_path, syncfs_min_logs):
    """A log's file thread finishing a rotated file holds its sync lock: a round leaves the log
    to a later round instead of every other log waiting."""
    group = SyncGroup(syncfs_min_logs=syncfs_min_logs, name="danube-wal-test-busy")
    logs = _open_logs(tmp_path, 6, group, sync="always")

    async def run() -> None:
        lasts = [wal.append_frames(_frames(b"x"))[1] for wal in logs]
        with logs[0]._syncer.lock:  # as FileKeeper's trim does
            first = asyncio.ensure_future(logs[0].wait_durable(lasts[0]))  # asks first, alone
            await asyncio.sleep(0.05)
            await asyncio.wait_for(
                asyncio.gather(*(wal.wait_durable(last) for wal, last in zip(logs[1:], lasts[1:]))), 20
            )
            assert logs[0].durable_offset < lasts[0] and not first.done()
        await asyncio.wait_for(first, 20)

    try:
        asyncio.run(run())
    finally:
        for wal in logs:
            wal.close()


def _child_syncs(path, group) -> None:
    wal = Wal.open(path, sync_group=group, sync="always")
    _first, last = wal.append_frames(_frames(b"child"))
    asyncio.run(asyncio.wait_for(wal.wait_durable(last), 20))
    wal.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork(2) only")
def test_a_forked_child_starts_its_own_group_thread(tmp_path):
    import multiprocessing

    group = SyncGroup(name="danube-wal-test-fork")
    logs = _open_logs(tmp_path, 1, group, sync="always")
    try:
        asyncio.run(_append_and_wait_all(logs, rounds=1))  # the parent's group thread runs
        child = multiprocessing.get_context("fork").Process(target=_child_syncs, args=(tmp_path / "child", group))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode == 0  # its waiter was answered: the group started a thread there
    finally:
        for wal in logs:
            wal.close()


@pytest.mark.parametrize("syncfs_min_logs", [4, 0], ids=["syncfs", "per-file"])
def test_always_the_next_round_starts_without_waiting_for_the_event_loop(tmp_path, syncfs_min_logs):
    """sync=always: what was appended while a round ran is synced by the next round, which starts
    as soon as that one ends -- not when the (busy) event loop gets to the round's answers and
    asks again.  The loop here is kept busy throughout, as a loaded broker's is."""
    group = SyncGroup(syncfs_min_logs=syncfs_min_logs, name="danube-wal-test-back-to-back")
    logs = _open_logs(tmp_path, 4, group, sync="always")
    entered = threading.Event()
    release = threading.Event()
    syncer = logs[0]._syncer
    real_sync_files, real_fs_target = syncer._sync_files, syncer._fs_target

    def gated_sync_files() -> None:
        entered.set()
        release.wait(10)
        real_sync_files()

    syncer._sync_files = gated_sync_files
    syncer._fs_target = None  # this log syncs its own files: the gate holds the whole round

    async def run() -> None:
        answered: list[int] = []
        firsts = [wal.append_frames(_frames(b"a"))[1] for wal in logs]
        for wal, last in zip(logs, firsts):
            wal.when_durable(last, lambda exc, last=last: answered.append(last))
        # the loop stays busy from here on: no callback runs, nobody asks again
        assert entered.wait(10), "the first round did not start"
        seconds = [wal.append_frames(_frames(b"b"))[1] for wal in logs]
        release.set()
        wait_until(
            lambda: all(wal.durable_offset >= last for wal, last in zip(logs, seconds)),
            timeout=10,
            what="the appends made during a round synced by the next one",
        )
        assert answered == []  # the answers are still queued for the loop
        await async_wait_until(lambda: len(answered) == len(logs), 10, "the first waiters answered")
        assert sorted(answered) == sorted(firsts)

    try:
        asyncio.run(run())
        assert group.rounds >= 2
    finally:
        syncer._sync_files, syncer._fs_target = real_sync_files, real_fs_target
        for wal in logs:
            wal.close()


_MODEL_GROUP = SyncGroup(syncfs_min_logs=0, name="danube-wal-test-model")


class _FakeLog:
    """What a Syncer needs of a log: its appended end, a sync of it, a one-shot append hook."""

    def __init__(self) -> None:
        self.appended = -1
        self.synced: list[int] = []
        self.hook = None
        self.lock = threading.Lock()

    def append(self, n: int) -> int:
        with self.lock:
            self.appended += n
            hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return self.appended

    def sync_files(self) -> None:
        self.synced.append(self.appended)

    def watch(self, hook) -> None:
        with self.lock:
            self.hook = hook


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(["always", "interval"]),
    steps=st.lists(st.tuples(st.sampled_from(["append", "wait", "busy"]), st.integers(1, 3)), max_size=25),
)
def test_every_waiter_is_answered_after_its_offset_is_durable_and_nothing_is_left_unsynced(policy, steps):
    """The group's rounds as a state machine, driven by any interleaving of appends, waits and a
    busy event loop: a waiter is answered exactly once, on its loop, never inside the call that
    registered it and only once its offset is durable; durable never passes appended; and under
    interval what was appended ends up durable with nothing more asked (the append hook)."""
    from danube.wal.options import SyncPolicy
    from danube.wal.sync import Syncer

    log = _FakeLog()
    syncer = Syncer(
        SyncPolicy(policy), 2.0, lambda: log.appended, log.sync_files, group=_MODEL_GROUP, watch_appends=log.watch
    )
    answered: list[tuple[int, int]] = []

    async def run() -> None:
        registering = [False]
        waited: list[int] = []
        for op, n in steps:
            if op == "busy":
                time.sleep(0.001 * n)  # the loop does not turn: answers queue up
                continue
            offset = log.append(n)
            if op == "wait":
                waited.append(offset)
                registering[0] = True

                def answer(exc, offset=offset) -> None:
                    assert not registering[0] and exc is None
                    answered.append((offset, syncer.durable_offset))

                syncer.when_durable(offset, answer)
                registering[0] = False
            await asyncio.sleep(0)
        await async_wait_until(lambda: len(answered) == len(waited), 10, "every waiter answered", 0.005)
        assert sorted(o for o, _ in answered) == sorted(waited)

    try:
        asyncio.run(run())
        assert all(durable >= offset for offset, durable in answered)
        if policy == "interval":
            wait_until(lambda: syncer.durable_offset == log.appended, 10, "everything appended synced", 0.005)
        assert log.synced == sorted(log.synced) and all(-1 <= s <= log.appended for s in log.synced)
    finally:
        syncer.close()


def test_always_a_log_whose_sync_failed_does_not_start_round_after_round():
    """Rounds run back to back only while syncs succeed: after an I/O error the waiters hear it
    and the log is not synced again and again for appends nobody can be told about."""
    from danube.wal.options import SyncPolicy
    from danube.wal.sync import Syncer

    group = SyncGroup(syncfs_min_logs=0, name="danube-wal-test-failed")
    log = _FakeLog()
    attempts: list[int] = []

    def failing_sync() -> None:
        attempts.append(log.appended)
        log.append(1)  # more arrives while the (failing) round runs
        raise OSError(5, "I/O error")

    syncer = Syncer(SyncPolicy.ALWAYS, 5.0, lambda: log.appended, failing_sync, group=group)

    async def run() -> BaseException | None:
        fut = asyncio.get_running_loop().create_future()
        syncer.when_durable(log.append(1), fut.set_result)
        return await asyncio.wait_for(fut, 10)

    try:
        assert isinstance(asyncio.run(run()), OSError)
        time.sleep(0.2)
        assert len(attempts) == 1 and group.rounds == 1
    finally:
        syncer.close()


def test_a_round_spreads_only_logs_with_something_to_sync_over_its_workers(tmp_path):
    """Logs asked for while the round before covered them have nothing left to sync: a round of
    such logs starts no worker threads (each hand-off to a worker costs more than the no-op)."""
    group = SyncGroup(syncfs_min_logs=0, name="danube-wal-test-nothing")
    logs = _open_logs(tmp_path, 3 * 4 + 1, group, sync="always")
    try:
        for wal in logs:
            wal.append(b"x")  # outside a loop: synced on this thread
        assert all(wal.durable_offset == wal.next_offset - 1 for wal in logs)
        group._round([wal._syncer for wal in logs])
        assert group._pool is None and group.rounds == 1
        # ... while a round with that many logs to sync does spread them
        for wal in logs:
            wal.append_frames(_frames(b"y"))
        group._round([wal._syncer for wal in logs])
        assert group._pool is not None
        assert all(wal.durable_offset == wal.next_offset - 1 for wal in logs)
    finally:
        for wal in logs:
            wal.close()
