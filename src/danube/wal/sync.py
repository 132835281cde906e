"""Durability: the sync policies and group commit.

One lock serialises fdatasync calls.  Whoever holds it first notes the highest
offset appended so far, syncs, and marks everything up to there durable; callers
that queued behind it usually find their offsets already covered and return
without a second fdatasync.  That is the group commit: concurrent waiters share
one fdatasync.  ``os.fdatasync`` releases the GIL, and async waiters never sync
on their event loop: a dedicated sync thread does it and resolves their futures
with ``call_soon_threadsafe``.

Cadence of the sync thread.  ``always``: a sync starts as soon as a waiter asks; a
waiter arriving while one is in flight is covered by the next, which starts right
after.  ``interval``: a sync starts as soon as there is something to sync (a
waiter, or appends beyond the durable offset), on a budget of one sync per
interval: the syncs keep to an even schedule of one per interval, and one may
start up to one interval ahead of it.  Over any stretch of time there are at most
two syncs more than whole intervals in it, and the next sync is always allowed
within one interval of the last one's start -- so a waiter waits at most one
interval plus one fdatasync (the thread notices unwaited appends by polling once
per interval while idle).

Why the allowance: a writer that appends once per interval (a paced producer, a
5 ms linger) drifts against a strict start-to-start gap, and then every append
waits out most of an interval.  With one interval of slack it is synced at once,
and the budget is the same (measurements: docs/benchmarks.md, "Fifth pass").
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

from danube.errors import WalClosedError
from danube.wal.options import SyncPolicy

log = logging.getLogger("danube.wal")


class IntervalBudget:
    """When ``sync=interval`` may start its next sync: one per interval on an even schedule, and
    at most one interval ahead of it (see the module docstring for why)."""

    def __init__(self, interval_s: float, now: float) -> None:
        self.interval_s = interval_s
        self._on_schedule = now   # when the next sync falls due on the even schedule

    def earliest_start(self) -> float:
        return self._on_schedule - self.interval_s

    def started(self, now: float) -> None:
        # an idle stretch does not bank syncs: the schedule restarts from now
        self._on_schedule = max(self._on_schedule, now) + self.interval_s


class Syncer:
    def __init__(self, policy: SyncPolicy, interval_ms: float, appended: Callable[[], int],
                 sync_files: Callable[[], None], after_sync: Callable[[], object] | None = None) -> None:
        self.policy = policy
        self.interval_s = interval_ms / 1000.0
        self._appended = appended       # highest offset appended (next_offset - 1)
        self._sync_files = sync_files   # fdatasync what holds appended offsets (under ``lock``)
        self._after_sync = after_sync   # a chore after each sync, once its waiters are answered
        self._durable = appended()      # what exists at open was recovered from disk
        self._lock = threading.Lock()
        self.lock = self._lock          # held during every fdatasync of appended data
        self._cond = threading.Condition()
        self._requested = False
        self._closing = False
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._waiters_lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.sync_count = 0
        if policy is not SyncPolicy.NEVER:
            self._thread = threading.Thread(target=self._run, name="danube-wal-sync", daemon=True)
            self._thread.start()

    @property
    def durable_offset(self) -> int:
        if self.policy is SyncPolicy.NEVER:
            return self._appended()
        return self._durable

    def has_waiters(self) -> bool:
        return bool(self._waiters) or self._requested

    def sync_now(self) -> int:
        """fdatasync everything appended so far (sharing a sync in progress); return the durable offset."""
        synced = False
        with self._lock:
            target = self._appended()
            if target > self._durable:
                self._sync_files()
                self.sync_count += 1
                self._durable = target
                synced = True
        self._resolve_waiters()
        if synced and self._after_sync is not None:
            try:
                self._after_sync()
            except Exception:  # a chore must never fail a sync or its waiters: log it, stop it
                self._after_sync = None
                log.exception("WAL: the after-sync chore failed and is turned off (durability is unaffected)")
        return self._durable

    async def wait_durable(self, offset: int) -> None:
        if offset <= self.durable_offset:
            return
        if self._closing:
            raise WalClosedError("the WAL is closed")
        if self._error is not None:
            raise self._error
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._waiters_lock:
            self._waiters.append((offset, loop, fut))
        with self._cond:
            self._requested = True
            self._cond.notify()
        if offset <= self._durable:
            self._resolve_waiters()
        await fut

    def _run(self) -> None:
        always = self.policy is SyncPolicy.ALWAYS
        interval = self.interval_s
        budget = None if always else IntervalBudget(interval, time.monotonic())
        while True:
            with self._cond:
                if always:
                    while not self._requested and not self._closing:
                        self._cond.wait()
                else:
                    while not self._closing:
                        now = time.monotonic()
                        due = budget.earliest_start()
                        if now < due:
                            self._cond.wait(due - now)
                        elif self._requested or self._appended() > self._durable:
                            break
                        else:  # idle: look again in an interval, or at once when a waiter asks
                            self._cond.wait(interval)
                self._requested = False
                if self._closing:
                    return
            if budget is not None:
                budget.started(time.monotonic())
            try:
                self.sync_now()
            except BaseException as exc:  # an I/O error fails the waiters instead of hanging them
                self._error = exc
                self._fail_waiters(exc)

    def _resolve_waiters(self) -> None:
        if not self._waiters:
            return
        durable = self._durable
        with self._waiters_lock:
            ready = [w for w in self._waiters if w[0] <= durable]
            if not ready:
                return
            self._waiters = [w for w in self._waiters if w[0] > durable]
        resolve_futures(((loop, fut) for _offset, loop, fut in ready), None)

    def _fail_waiters(self, exc: BaseException) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        resolve_futures(((loop, fut) for _offset, loop, fut in waiters), exc)

    def close(self) -> None:
        """Stop the sync thread after a last sync (policies other than never)."""
        if self.policy is not SyncPolicy.NEVER and not self._closing:
            try:
                self.sync_now()
            except OSError:
                pass
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
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
