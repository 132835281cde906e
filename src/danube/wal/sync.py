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
right after -- and so is a log appended to while a round ran, asked for by the
round itself rather than by the event loop once it gets to the round's answers (a
busy loop would otherwise leave the group idle between rounds).  ``interval``: a
log someone waits on is asked for as under ``always``, so an ``interval`` waiter is
never answered later than an ``always`` one; a log with appends nobody waits on
(the writer tells the group once per round through its one-shot append hook, so an
idle log costs nothing) is synced on a budget of one round per interval: rounds
keep to an even schedule of one per interval, and one may start up to one interval
ahead of it.  Over any stretch of time there are at most two such rounds more than
whole intervals in it, and the next is always allowed within one interval of the
last one's start -- so an append is durable within one interval plus one round.  A
round started for any reason covers every log with something to sync, whatever its
policy.

Why the allowance: a writer that appends once per interval (a paced producer, a
5 ms linger) drifts against a strict start-to-start gap, and then every append
waits out most of an interval.  With one interval of slack it is synced at once,
and the budget is the same (measurements: docs/benchmarks.md,
"Half-rate point, pacing, interval syncer, glibc malloc").

Waiters are callbacks (:meth:`Syncer.when_durable`; ``wait_durable`` is one around a future): a
topic's commit queue registers one per round and is called on its loop with no task or future
of its own.  Here: one log's part (:class:`Syncer`); the rounds: ``danube.wal.sync_group``; the
hand-off to event loops: ``danube.wal.handoff``.
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
from danube.wal.handoff import DurableCallback, _set, call_back, resolve_futures
from danube.wal.options import SyncPolicy
from danube.wal.sync_group import (
    _BUSY,
    BUSY_PAUSE_S,
    MIN_LOGS_PER_WORKER,
    ROUND_WORKERS,
    SYNCFS_MIN_LOGS,
    IntervalBudget,
    SyncGroup,
    default_sync_group,
    process_sync_groups,
)

__all__ = [
    "BUSY_PAUSE_S",
    "MIN_LOGS_PER_WORKER",
    "ROUND_WORKERS",
    "SYNCFS_MIN_LOGS",
    "DurableCallback",
    "IntervalBudget",
    "SyncGroup",
    "Syncer",
    "default_sync_group",
    "process_sync_groups",
    "resolve_futures",
]

log = logging.getLogger("danube.wal")


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
        after_sync: Callable[..., object] | None = None,
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
        if offset <= (self._durable if self._group is not None else self._appended()):  # (durable_offset)
            loop.call_soon(callback, None)
            return
        if self._closing or self._error is not None:
            loop.call_soon(callback, self._error or WalClosedError("the WAL is closed"))
            return
        with self._waiters_lock:
            self._waiters.append((offset, loop, callback))
        # sync=never returned above (its durable offset is the appended end; callers wait for offsets
        # they appended), and only sync=never logs have no group
        group = self._group
        assert group is not None, "a sync=never log waited for an offset not appended"
        # Already asked for (appended to while a round ran, or another wait this turn): the round
        # that takes the request reads the appended offset after it, so it covers this one too --
        # no lock and no wake-up per wait (a racy read: absent means ask, as before).
        if self not in group._urgent:
            group.request(self)
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

    def _unsynced(self) -> bool:
        """Appended beyond the durable offset (read without the lock: a hint for the group)."""
        return not self._closing and self._appended() > self._durable

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

    def _fs_synced(self, target: int, took_ms: float, bucket: int, ready: list) -> None:
        """Everything through ``target`` was written back by a syncfs that took ``took_ms`` (the
        lock is held, and stays held until :meth:`_fs_after`), in latency bucket ``bucket``
        (``FlushLatency.bucket``: found once per round); the waiters it covers go to ``ready`` as
        ``(loop, callback)`` pairs."""
        self.latency.add(bucket, took_ms)
        self.sync_count += 1
        self._durable = target
        if self._waiters:
            self._take_ready(ready)

    def _fs_after(self, rearms: list, again: list) -> None:
        """After a syncfs round's answers, the lock still held from :meth:`_fs_prepare` (so the log
        is not closing): the after-sync chore (its file to rearm goes to ``rearms``), and the log
        goes to ``again`` when appended to meanwhile (sync=always) -- :meth:`_after_round` for the
        syncfs path, without a second acquire of the lock."""
        chore = self._after_sync
        if chore is not None:
            try:  # (``_run_chore``, inline: once per log per round)
                chore(rearms)
            except Exception:  # a chore must never fail a sync or its waiters: log it, stop it
                self._after_sync = None
                log.exception("WAL: the after-sync chore failed and is turned off (durability is unaffected)")
        if self._watch is not None:
            self._arm()
        elif self.policy is SyncPolicy.ALWAYS and self._error is None and self._appended() > self._durable:
            again.append(self)

    def _take_ready(self, ready: list) -> None:
        """The waiters the round covered go to ``ready`` as ``(loop, callback)`` pairs (removed
        from the log)."""
        if not self._waiters:
            return
        durable = self._durable
        with self._waiters_lock:
            waiters = self._waiters
            if len(waiters) == 1 and waiters[0][0] <= durable:  # (a topic's commits: one wait out)
                self._waiters = []
                ready.append(waiters[0][1:])
                return
            covered = [(loop, fn) for offset, loop, fn in waiters if offset <= durable]
            if covered:
                self._waiters = [] if len(covered) == len(waiters) else [w for w in waiters if w[0] > durable]
                ready.extend(covered)

    def _after_round(self, rearms: list | None = None, again: list | None = None) -> None:
        """``rearms``: the round's list the chore adds its file to rearm to (the group rearms them
        all at once), instead of rearming it itself; ``again``: the round's list of logs to ask
        for again, instead of asking the group itself."""
        if self._synced_in_round:
            self._synced_in_round = False
            # under the lock: close() (which takes it) may be closing the files the chore touches
            with self._lock:
                if not self._closing:
                    self._run_chore(rearms)
        if self._watch is not None and not self._closing:
            self._arm()
        elif (
            self.policy is SyncPolicy.ALWAYS
            and not self._closing
            and self._error is None  # (a failed sync is not retried round after round)
            and self._appended() > self._durable
        ):
            # Appended while the round ran: the next round starts now rather than when the event
            # loop, busy, gets round to this round's answers and asks again -- its waiter then
            # finds the offset durable already, or just joins the round in flight.
            assert self._group is not None, "sync=always logs have a sync group"
            if again is None:
                self._group.request(self)
            else:
                again.append(self)

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

    def _run_chore(self, rearms: list | None = None) -> None:
        if self._after_sync is None:
            return
        try:
            if rearms is None:
                self._after_sync()
            else:
                self._after_sync(rearms)
        except Exception:  # a chore must never fail a sync or its waiters: log it, stop it
            self._after_sync = None
            log.exception("WAL: the after-sync chore failed and is turned off (durability is unaffected)")

    def _resolve_waiters(self) -> None:
        ready: list = []
        self._take_ready(ready)
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
