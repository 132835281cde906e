"""Durability: the sync policies and group commit, per log and across logs.

Per log, one lock serialises fdatasync calls.  Whoever holds it first notes the
highest offset appended so far, syncs, and marks everything up to there durable;
callers that queued behind it usually find their offsets already covered and
return without a second fdatasync.  ``os.fdatasync`` releases the GIL.

Across logs, async waiters never sync on their event loop: they ask the log's
:class:`SyncGroup` (one per process unless a log is given its own), whose one
thread runs *rounds*.  A round takes every log with something to sync at that
moment, fdatasyncs them -- spread over a few worker threads, because concurrent
fdatasyncs of different files share the file system's journal commit where one
after another each waits for its own -- and then answers every waiter of every
log in the round with one hand-off per event loop.  So a broker writing a hundred
topics pays one round, not a hundred sync threads each waking its loop, and the
threads do not grow with the number of logs (measurements: docs/benchmarks.md,
"Many active topics").

Cadence of the rounds.  ``always``: a round starts as soon as a waiter asks; a
waiter arriving while a round is in flight is covered by the next, which starts
right after.  ``interval``: a round for a log starts as soon as it has something
to sync (a waiter, or an append beyond the durable offset: the writer tells the
group once per round through its one-shot append hook, so an idle log costs
nothing), on a budget of one round per interval: rounds keep to an even schedule
of one per interval, and one may start up to one interval ahead of it.  Over any
stretch of time there are at most two rounds more than whole intervals in it, and
the next round is always allowed within one interval of the last one's start --
so a waiter waits at most one interval plus one round.  A round started for any
reason covers every log with something to sync, whatever its policy.

Why the allowance: a writer that appends once per interval (a paced producer, a
5 ms linger) drifts against a strict start-to-start gap, and then every append
waits out most of an interval.  With one interval of slack it is synced at once,
and the budget is the same (measurements: docs/benchmarks.md,
"Half-rate point, pacing, interval syncer, glibc malloc").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial
from typing import Any, Callable

from danube.errors import WalClosedError
from danube.wal.flushstats import FlushLatency
from danube.wal.options import SyncPolicy
from danube.wal.workers import WorkerPool

log = logging.getLogger("danube.wal")

# called with None once an offset is durable, or with the error that keeps it from becoming so
DurableCallback = Callable[[BaseException | None], object]


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
    import os

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
        self._cond = threading.Condition()
        self._urgent: dict[Syncer, None] = {}  # sync=always logs asked to sync now
        self._paced: dict[float, dict[Syncer, None]] = {}  # sync=interval logs, by interval
        self._budgets: dict[float, IntervalBudget] = {}
        self._thread: threading.Thread | None = None
        self._pool: WorkerPool | None = None  # made on the first round that needs one
        self._syncfs_failed = False
        self.rounds = 0  # rounds run (tests, stats, the metrics page)
        self.synced_logs = 0  # logs in them
        self.fs_syncs = 0  # syncfs calls made for them
        self.round_latency = FlushLatency()  # a round's length, from its first sync to its waiters answered

    def request(self, syncer: "Syncer") -> None:
        """``syncer`` has something to sync (any thread)."""
        with self._cond:
            if syncer.policy is SyncPolicy.ALWAYS:
                self._urgent[syncer] = None
            else:
                self._paced.setdefault(syncer.interval_s, {})[syncer] = None
            thread = self._thread
            if thread is None or not thread.is_alive():  # first use (or a forked child)
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def forget(self, syncer: "Syncer") -> None:
        with self._cond:
            self._urgent.pop(syncer, None)
            paced = self._paced.get(syncer.interval_s)
            if paced is not None:
                paced.pop(syncer, None)

    def _next_round(self) -> list["Syncer"]:
        """Wait until a round is due; the logs it covers."""
        with self._cond:
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
                self._cond.wait(wait)
            due_logs = list(self._urgent)
            self._urgent.clear()
            for paced in self._paced.values():
                due_logs.extend(paced)
                paced.clear()
        return due_logs

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
        if self.syncfs_min_logs and len(logs) >= self.syncfs_min_logs:
            rest = self._sync_file_systems(logs, busy)
        workers = min(self.workers, len(rest) // MIN_LOGS_PER_WORKER)
        if workers <= 0:
            _sync_all(rest, busy)
        else:
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
        self.rounds += 1
        self.synced_logs += len(logs)
        ready: list = []
        for syncer in logs:
            ready.extend(syncer._take_ready())
        call_back(ready, None)
        self.round_latency.record((time.perf_counter() - started) * 1000.0)
        for syncer in logs:
            syncer._after_round()
        if busy:
            # A log whose lock someone holds (its file thread finishing a rotated file, a blocking
            # sync) goes to the next round rather than every other log waiting for it now; a
            # round of nothing but such logs pauses a moment before trying again.
            if len(busy) == len(logs):
                time.sleep(BUSY_PAUSE_S)
            for syncer in busy:
                self.request(syncer)

    def _sync_file_systems(self, logs: list["Syncer"], busy: list["Syncer"]) -> list["Syncer"]:
        """One syncfs per file system for the logs that allow it (each held under its lock from
        the moment its target offset is read until it is marked durable); the others are returned
        to be synced file by file."""
        rest: list[Syncer] = []
        held: dict[int, tuple[int, list[tuple[Syncer, int]]]] = {}
        try:
            for syncer in logs:
                prepared = syncer._fs_prepare()
                if prepared is None:
                    rest.append(syncer)
                elif prepared is _BUSY:
                    busy.append(syncer)
                else:
                    dev, fd, target = prepared
                    held.setdefault(dev, (fd, []))[1].append((syncer, target))
            for fd, items in held.values():
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
                for syncer, target in items:
                    syncer._fs_synced(target, took_ms)
        finally:
            for _fd, items in held.values():
                for syncer, _target in items:
                    syncer._lock.release()
        return rest


_BUSY = object()


def _sync_all(logs: list["Syncer"], busy: list["Syncer"]) -> None:
    for syncer in logs:
        if not syncer._round_sync():
            busy.append(syncer)  # list.append: safe from the round's worker threads


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


class Syncer:
    """One log's durability: its durable offset, its waiters, and its part in the group's rounds.

    ``watch_appends(callback)`` (sync=interval) arms a one-shot call of ``callback`` after the
    log's next append, from the appending thread: how the group learns that a log nobody waits
    on has something to sync, without looking at idle logs."""

    def __init__(
        self,
        policy: SyncPolicy,
        interval_ms: float,
        appended: Callable[[], int],
        sync_files: Callable[[], None],
        after_sync: Callable[[], object] | None = None,
        *,
        group: SyncGroup | None = None,
        watch_appends: Callable[[Callable[[], None]], None] | None = None,
        fs_target: Callable[[], tuple[int, int] | None] | None = None,
        latency: FlushLatency | None = None,
    ) -> None:
        self.policy = policy
        self.interval_s = interval_ms / 1000.0
        self._appended = appended  # highest offset appended (next_offset - 1)
        self._sync_files = sync_files  # fdatasync what holds appended offsets (under ``lock``)
        self._after_sync = after_sync  # a chore after each sync, once its waiters are answered
        # (device, fd) to syncfs instead of syncing the files, or None when the log needs its own
        # syncs this time (a rotated file or the directory not synced yet)
        self._fs_target = fs_target
        self._durable = appended()  # what exists at open was recovered from disk
        self._lock = threading.Lock()
        self.lock = self._lock  # held during every fdatasync of appended data
        self._closing = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, DurableCallback]] = []
        self._waiters_lock = threading.Lock()
        self._error: BaseException | None = None
        self._synced_in_round = False
        self.sync_count = 0
        self.latency = latency if latency is not None else FlushLatency()  # of each sync of this log
        self._group: SyncGroup | None = None
        self._watch = None
        if policy is not SyncPolicy.NEVER:
            self._group = group if group is not None else default_sync_group()
            if policy is SyncPolicy.INTERVAL:
                self._watch = watch_appends
                self._arm()

    @property
    def durable_offset(self) -> int:
        if self.policy is SyncPolicy.NEVER:
            return self._appended()
        return self._durable

    def has_waiters(self) -> bool:
        return bool(self._waiters)

    def sync_now(self) -> int:
        """fdatasync everything appended so far (sharing a sync in progress); return the durable offset."""
        synced = False
        with self._lock:
            target = self._appended()
            if target > self._durable:
                started = time.perf_counter()
                self._sync_files()
                self.latency.record((time.perf_counter() - started) * 1000.0)
                self.sync_count += 1
                self._durable = target
                synced = True
        self._resolve_waiters()
        if synced:
            self._run_chore()
        return self._durable

    def when_durable(self, offset: int, callback: "DurableCallback") -> None:
        """Call ``callback(None)`` on the running event loop once ``offset`` is durable, or
        ``callback(error)`` once it cannot become durable (the log closed, an I/O error).  Never
        called before this returns.  A round answers every callback it covered on one loop with
        one hand-off, so a caller with its own bookkeeping (a topic's commits) needs no future and
        no task per wait."""
        loop = asyncio.get_running_loop()
        if offset <= self.durable_offset:
            loop.call_soon(callback, None)
            return
        if self._closing or self._error is not None:
            loop.call_soon(callback, self._error or WalClosedError("the WAL is closed"))
            return
        with self._waiters_lock:
            self._waiters.append((offset, loop, callback))
        # sync=never returned above (its durable offset is the appended end; callers wait for offsets
        # they appended), and only sync=never logs have no group
        assert self._group is not None, "a sync=never log waited for an offset not appended"
        self._group.request(self)
        if offset <= self._durable:  # a round finished between the check and the request
            self._resolve_waiters()

    async def wait_durable(self, offset: int) -> None:
        if offset <= self.durable_offset:
            return
        if self._closing:
            raise WalClosedError("the WAL is closed")
        if self._error is not None:
            raise self._error
        fut = asyncio.get_running_loop().create_future()
        self.when_durable(offset, partial(_set, fut))
        await fut

    # ------------------------------------------------------------ the group's side

    def _round_sync(self) -> bool:
        """Sync for a round, file by file (the group's threads); False when someone else holds
        the lock (nothing done)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._sync_locked()
        finally:
            self._lock.release()
        return True

    def _sync_locked(self) -> None:
        if self._closing:
            return
        try:
            target = self._appended()
            if target > self._durable:
                started = time.perf_counter()
                self._sync_files()
                self.latency.record((time.perf_counter() - started) * 1000.0)
                self.sync_count += 1
                self._durable = target
                self._synced_in_round = True
        except BaseException as exc:  # an I/O error fails the waiters instead of hanging them
            self._error = exc
            self._fail_waiters(exc)

    def _fs_prepare(self) -> Any:
        """For a syncfs round: ``(device, fd, target offset)`` with the lock held (the group
        releases it), None (lock not held) when this log must sync its own files, or ``_BUSY``
        when someone else holds the lock."""
        if self._fs_target is None:
            return None
        if not self._lock.acquire(blocking=False):
            return _BUSY
        try:
            target = self._appended()
            where = None if self._closing or target <= self._durable else self._fs_target()
        except BaseException:
            self._lock.release()
            raise
        if where is None:
            self._lock.release()
            return None
        return where[0], where[1], target

    def _fs_synced(self, target: int, took_ms: float) -> None:
        """Everything through ``target`` was written back by a syncfs that took ``took_ms`` (the
        lock is held)."""
        self.latency.record(took_ms)
        self.sync_count += 1
        self._durable = target
        self._synced_in_round = True

    def _take_ready(self) -> list:
        """The waiters the round covered, as ``(loop, callback)`` pairs (removed from the log)."""
        if not self._waiters:
            return []
        durable = self._durable
        with self._waiters_lock:
            ready = [(loop, fn) for offset, loop, fn in self._waiters if offset <= durable]
            if ready:
                self._waiters = [w for w in self._waiters if w[0] > durable]
        return ready

    def _after_round(self) -> None:
        if self._synced_in_round:
            self._synced_in_round = False
            # under the lock: close() (which takes it) may be closing the files the chore touches
            with self._lock:
                if not self._closing:
                    self._run_chore()
        if self._watch is not None and not self._closing:
            self._arm()

    def _arm(self) -> None:
        """sync=interval: hear of the next append (and of one that came before the hook was set)."""
        if self._watch is not None:
            self._watch(self._appended_since)
        if self._appended() > self._durable and not self._closing:
            assert self._group is not None, "sync=interval logs have a sync group"
            self._group.request(self)

    def _appended_since(self) -> None:
        if not self._closing:
            assert self._group is not None, "sync=interval logs have a sync group"
            self._group.request(self)

    def _run_chore(self) -> None:
        if self._after_sync is None:
            return
        try:
            self._after_sync()
        except Exception:  # a chore must never fail a sync or its waiters: log it, stop it
            self._after_sync = None
            log.exception("WAL: the after-sync chore failed and is turned off (durability is unaffected)")

    def _resolve_waiters(self) -> None:
        ready = self._take_ready()
        if ready:
            call_back(ready, None)

    def _fail_waiters(self, exc: BaseException) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        if waiters:
            call_back([(loop, fn) for _offset, loop, fn in waiters], exc)

    def close(self) -> None:
        """A last sync (policies other than never); then the group forgets this log."""
        if self.policy is not SyncPolicy.NEVER and not self._closing:
            try:
                self.sync_now()
            except OSError:
                pass
        with self._lock:  # a round syncing this log finishes first; none starts after
            self._closing = True
        if self._group is not None:
            self._group.forget(self)
        self._fail_waiters(WalClosedError("the WAL was closed before the offset became durable"))


def _set(fut: asyncio.Future, exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _set_all(futures: list[asyncio.Future], exc: BaseException | None) -> None:
    for fut in futures:
        _set(fut, exc)


def _call_all(callbacks: list["DurableCallback"], exc: BaseException | None) -> None:
    for fn in callbacks:
        try:
            fn(exc)
        except Exception:  # noqa: BLE001 - one waiter's bug must not keep the others waiting
            log.exception("WAL: a durability callback failed")


def call_back(waiters: list, exc: BaseException | None) -> None:
    """Call ``(loop, callback)`` pairs with ``exc`` from any thread, each on its loop in a later
    turn (never inside the caller's): one hand-off per event loop, not one per callback (each
    ``call_soon_threadsafe`` wakes the loop through its self-pipe)."""
    if not waiters:
        return
    by_loop: dict[asyncio.AbstractEventLoop, list[DurableCallback]] = {}
    for loop, fn in waiters:
        by_loop.setdefault(loop, []).append(fn)
    running = asyncio._get_running_loop()
    for loop, callbacks in by_loop.items():
        try:
            if running is loop:
                loop.call_soon(_call_all, callbacks, exc)
            else:
                loop.call_soon_threadsafe(_call_all, callbacks, exc)
        except RuntimeError:  # the waiters' loop is closed; nobody is left to call
            pass


def resolve_futures(waiters, exc: BaseException | None) -> None:
    """Resolve ``(loop, future)`` pairs from any thread: one hand-off per event loop, not one per
    future (each ``call_soon_threadsafe`` wakes the loop through its self-pipe)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future]] = {}
    for loop, fut in waiters:
        by_loop.setdefault(loop, []).append(fut)
    running = asyncio._get_running_loop()
    for loop, futures in by_loop.items():
        try:
            if running is loop:
                _set_all(futures, exc)
            else:
                loop.call_soon_threadsafe(_set_all, futures, exc)
        except RuntimeError:  # the waiters' loop is closed; nobody is left to wake
            pass
