"""Group commit across logs: :class:`SyncGroup` runs the rounds that sync every log with
something to sync (see ``danube.wal.sync`` for the cadence and why), on one thread and a few
workers, however many logs there are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable

from danube import _native
from danube.wal.flushstats import FlushLatency
from danube.wal.handoff import call_back
from danube.wal.options import REARM_AHEAD_BYTES, SyncPolicy
from danube.wal.workers import WorkerPool

if TYPE_CHECKING:
    from danube.wal.sync import Syncer

log = logging.getLogger("danube.wal")
_walfile = _native.load("walfile")


class IntervalBudget:
    """When ``sync=interval`` may start its next sync: one per interval on an even schedule, and
    at most one interval ahead of it (see the module docstring for why)."""

    def __init__(self, interval_s: float, now: float) -> None:
        self.interval_s = interval_s
        self._on_schedule = now  # when the next sync falls due on the even schedule

    def earliest_start(self) -> float:
        return self._on_schedule - self.interval_s

    def started(self, now: float) -> None:
        # an idle stretch does not bank syncs: the schedule restarts from now
        self._on_schedule = max(self._on_schedule, now) + self.interval_s


# A round of this many logs or more on one file system syncs the file system once (syncfs(2))
# instead of each log's files: one journal commit instead of one per file (0 turns it off).
SYNCFS_MIN_LOGS = 4
# Worker threads a round spreads per-file fdatasyncs over (besides the group's own thread), when
# syncfs is off or unavailable.
ROUND_WORKERS = 3
# Logs per worker below which a round syncs on the group's thread alone (a hand-off costs more).
MIN_LOGS_PER_WORKER = 4
# A round whose every log was locked by someone else waits this long before the next one.
BUSY_PAUSE_S = 0.0005


def _load_syncfs() -> Callable[[int], None] | None:
    """``syncfs(fd)``, or None where it cannot be trusted: not Linux, or a kernel before 5.8 (which
    did not report writeback errors from syncfs: an I/O error would pass for durable)."""
    import ctypes

    if not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return None
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syncfs
    except (ValueError, OSError, AttributeError):
        return None
    if (major, minor) < (5, 8):
        return None
    call.argtypes = [ctypes.c_int]

    def syncfs(fd: int) -> None:
        if call(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return syncfs


_syncfs = _load_syncfs()


class SyncGroup:
    """Group commit across logs: one thread runs rounds that sync every log with something to
    sync and answer all their waiters together.  Threads start on first use.

    ``syncfs_min_logs``: a round with at least this many logs on one file system makes them
    durable with one ``syncfs`` of it (which also writes back whatever else is dirty there: give
    the WAL a file system of its own, or 0 to sync each log's files)."""

    def __init__(
        self, workers: int = ROUND_WORKERS, *, syncfs_min_logs: int = SYNCFS_MIN_LOGS, name: str = "danube-wal-sync"
    ) -> None:
        self.workers = workers
        self.syncfs_min_logs = syncfs_min_logs if _syncfs is not None else 0
        self.name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleeping = False  # the group's thread waits on _cond: a request must wake it
        self._urgent: dict[Syncer, None] = {}  # logs asked to sync now (sync=always, or waited on)
        self._paced: dict[float, dict[Syncer, None]] = {}  # sync=interval logs, by interval
        self._budgets: dict[float, IntervalBudget] = {}
        self._thread: threading.Thread | None = None
        self._pool: WorkerPool | None = None  # made on the first round that needs one
        self._syncfs_failed = False
        self.rounds = 0  # rounds run (tests, stats, the metrics page)
        self.synced_logs = 0  # logs in them
        self.fs_syncs = 0  # syncfs calls made for them
        self.round_latency = FlushLatency()  # a round's length, from its first sync to its waiters answered
        _EVERY_GROUP.add(self)

    def request(self, syncer: "Syncer") -> None:
        """``syncer`` has something to sync (any thread).  Asked about once per log per round,
        from the event loop mostly: a request while a round is in flight only notes the log (the
        round's end looks again), and only one that changes when the sleeping thread must wake
        wakes it (an ``interval`` log joining others of its interval already has their turn)."""
        with self._lock:
            # A log someone waits on is urgent whatever its policy: an ``interval`` waiter is never
            # answered later than an ``always`` one would be (the budget paces what nobody waits on)
            if syncer.policy is SyncPolicy.ALWAYS or syncer.has_waiters():
                self._urgent[syncer] = None
                wake = True
            else:
                paced = self._paced.get(syncer.interval_s)
                if paced is None:
                    paced = self._paced[syncer.interval_s] = {}
                wake = not paced
                paced[syncer] = None
            if self._sleeping:
                if wake:
                    self._cond.notify()
            elif self._thread is None:  # first use (or a forked child: see _forget_threads)
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def _forget_threads(self) -> None:
        """In a forked child: the parent's threads are not there (the first request starts one)."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._sleeping = False
        self._thread = None
        self._pool = None

    def forget(self, syncer: "Syncer") -> None:
        with self._lock:
            self._urgent.pop(syncer, None)
            paced = self._paced.get(syncer.interval_s)
            if paced is not None:
                paced.pop(syncer, None)

    def _next_round(self) -> list["Syncer"]:
        """Wait until a round is due; the logs it covers."""
        with self._lock:
            while True:
                now = time.monotonic()
                due = bool(self._urgent)
                wait: float | None = None
                for interval, logs in self._paced.items():
                    if not logs:
                        continue
                    budget = self._budgets.get(interval)
                    if budget is None:
                        budget = self._budgets[interval] = IntervalBudget(interval, now)
                    start = budget.earliest_start()
                    if start <= now:
                        budget.started(now)
                        due = True
                    else:
                        wait = start - now if wait is None else min(wait, start - now)
                if due:
                    break
                self._sleeping = True
                try:
                    self._cond.wait(wait)
                finally:
                    self._sleeping = False
            due_logs = self._urgent
            self._urgent = {}
            for paced in self._paced.values():
                due_logs.update(paced)  # (a log may be in both: asked by its append hook, then waited on)
                paced.clear()
        return list(due_logs)

    def _run(self) -> None:
        while True:
            logs = self._next_round()
            try:
                self._round(logs)
            except BaseException:  # noqa: BLE001 - the thread serves every log: it must go on
                log.exception("WAL: a sync round failed")

    def _round(self, logs: list["Syncer"]) -> None:
        started = time.perf_counter()
        rest = logs
        busy: list[Syncer] = []
        ready: list = []  # the (loop, callback) pairs the round answers
        held: list[Syncer] = []  # logs locked for a syncfs: released at the end of the round
        fs_done: list[Syncer] = []  # those of them a syncfs made durable (waiters taken into ``ready``)
        rearms: list = []
        again: list[Syncer] = []  # appended to while the round ran: the next round starts now
        try:
            if self.syncfs_min_logs and len(logs) >= self.syncfs_min_logs:
                rest = self._sync_file_systems(logs, busy, held, fs_done, ready)
            # A log asked for while the round before covered it has nothing left: it takes no share
            # of the workers (a racy read is only a hint: a log appended to since is asked for again)
            rest = [syncer for syncer in rest if syncer._unsynced()]
            self._sync_rest(rest, busy)
            self.rounds += 1
            self.synced_logs += len(logs)
            others = logs if not fs_done else [] if len(fs_done) == len(logs) else _without(logs, fs_done)
            for syncer in others:
                syncer._take_ready(ready)
            call_back(ready, None)
            self.round_latency.record((time.perf_counter() - started) * 1000.0)
            # The syncfs'd logs' chores run under the locks their sync held (one pass, no second
            # acquire per log), after the answers: a waiter does not wait for another log's chore.
            for syncer in fs_done:
                syncer._fs_after(rearms, again)
        finally:
            for syncer in held:
                syncer._lock.release()
        for syncer in others:
            syncer._after_round(rearms, again)
        if rearms:
            # every log's tail page in one call, with the GIL released once: one release per log
            # meant one wait per log to get it back from a busy event loop, between rounds
            try:
                _walfile.rearm_many(rearms, REARM_AHEAD_BYTES)
            except Exception:  # noqa: BLE001 - advisory: durability is unaffected
                log.exception("WAL: rearming the round's tail pages failed")
        if again:
            with self._lock:  # (one acquire for them all)
                for syncer in again:
                    self._urgent[syncer] = None
                if self._sleeping:  # (only when the round ran elsewhere than the group's thread)
                    self._cond.notify()
        if busy:
            # A log whose lock someone holds (its file thread finishing a rotated file, a blocking
            # sync) goes to the next round rather than every other log waiting for it now; a
            # round of nothing but such logs pauses a moment before trying again.
            if len(busy) == len(logs):
                time.sleep(BUSY_PAUSE_S)
            for syncer in busy:
                self.request(syncer)

    def _sync_rest(self, rest: list["Syncer"], busy: list["Syncer"]) -> None:
        """Sync the logs a syncfs did not cover file by file, spread over the workers."""
        workers = min(self.workers, len(rest) // MIN_LOGS_PER_WORKER)
        if workers <= 0:
            _sync_all(rest, busy)
            return
        if self._pool is None:
            self._pool = WorkerPool(self.workers, self.name)
        share = workers + 1
        left = [share - 1]
        done = threading.Condition()

        def chunk(logs: list[Syncer]) -> None:
            try:
                _sync_all(logs, busy)
            finally:
                with done:
                    left[0] -= 1
                    done.notify()

        for i in range(1, share):
            self._pool.submit(chunk, rest[i::share])
        _sync_all(rest[0::share], busy)
        with done:
            done.wait_for(lambda: left[0] == 0)

    def _sync_file_systems(
        self,
        logs: list["Syncer"],
        busy: list["Syncer"],
        held: list["Syncer"],
        fs_done: list["Syncer"],
        ready: list,
    ) -> list["Syncer"]:
        """One syncfs per file system for the logs that allow it, each locked from the moment its
        target offset is read (the locks go to ``held``: the caller releases them once the round
        is done); those a syncfs covered go to ``fs_done``, their waiters to ``ready``.  The logs
        returned are to be synced file by file."""
        rest: list[Syncer] = []
        by_fs: dict[int, tuple[int, list[tuple[Syncer, int]]]] = {}
        for syncer in logs:
            prepared = syncer._fs_prepare()
            if prepared is None:
                rest.append(syncer)
            elif prepared is _BUSY:
                busy.append(syncer)
            else:
                held.append(syncer)
                dev, fd, target = prepared
                on_fs = by_fs.get(dev)
                if on_fs is None:
                    on_fs = by_fs[dev] = (fd, [])
                on_fs[1].append((syncer, target))
        for fd, items in by_fs.values():
            if len(items) < self.syncfs_min_logs:
                for syncer, _target in items:
                    syncer._sync_locked()
                continue
            try:
                started = time.perf_counter()
                _syncfs(fd)  # type: ignore[misc]  # not None: syncfs_min_logs is 0 without it
                took_ms = (time.perf_counter() - started) * 1000.0
                self.fs_syncs += 1
            except OSError as exc:
                # Another file's writeback error on this file system fails syncfs too: each log's
                # own fdatasync then tells whose data it was.
                if not self._syncfs_failed:
                    self._syncfs_failed = True
                    log.warning("WAL: syncfs failed (%s); syncing this round's logs file by file", exc)
                for syncer, _target in items:
                    syncer._sync_locked()
                continue
            bucket = FlushLatency.bucket(took_ms)
            for syncer, target in items:
                syncer._fs_synced(target, took_ms, bucket, ready)
                fs_done.append(syncer)
        return rest


def _without(logs: list["Syncer"], some: list["Syncer"]) -> list["Syncer"]:
    leave = set(some)
    return [syncer for syncer in logs if syncer not in leave]


_BUSY = object()


def _sync_all(logs: list["Syncer"], busy: list["Syncer"]) -> None:
    for syncer in logs:
        if not syncer._round_sync():
            busy.append(syncer)  # list.append: safe from the round's worker threads


_EVERY_GROUP: "weakref.WeakSet[SyncGroup]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for group in list(_EVERY_GROUP):
        group._forget_threads()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

_GROUPS: dict[bool, SyncGroup] = {}
_GROUPS_LOCK = threading.Lock()


def process_sync_groups() -> list[SyncGroup]:
    """The process-wide groups made so far (the broker's metrics page reports their rounds)."""
    with _GROUPS_LOCK:
        return list(_GROUPS.values())


def default_sync_group(syncfs: bool = True) -> SyncGroup:
    """The process-wide group every log joins unless it is given one (``Wal.open(sync_group=)``);
    ``syncfs=False``: the process-wide one whose rounds sync each log's files."""
    with _GROUPS_LOCK:
        group = _GROUPS.get(syncfs)
        if group is None:
            group = _GROUPS[syncfs] = SyncGroup(syncfs_min_logs=SYNCFS_MIN_LOGS if syncfs else 0)
        return group
