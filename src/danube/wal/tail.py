"""Waking readers that follow the log: one-shot, armed only while someone waits.

The writer calls ``on_append`` after an append only when ``armed`` is set, so an
append costs nothing extra while no reader waits.  Waiters register a future,
arm the writer, then re-check the log end (no lost wake-up: an append after the
check sees the armed flag).  The sync group arms it the same way, once per sync
round, to hear that a log under ``sync=interval`` has something to sync.
"""

from __future__ import annotations

import asyncio
import threading

from danube.wal.sync import resolve_futures


class AppendNotifier:
    def __init__(self, writer) -> None:
        self._writer = writer
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._watcher = None  # one-shot: called after the next append (the sync group)
        self.closed = False
        writer.on_append = self.wake_all

    def attach(self, writer) -> None:
        """Follow a new writer (the log was reopened after a suspend); waiters stay."""
        with self._lock:
            self._writer = writer
            writer.on_append = self.wake_all
            if self._waiters or self._watcher is not None:
                writer.armed = True

    def watch(self, callback) -> None:
        """Call ``callback()`` once, after the next append (from the appending thread)."""
        with self._lock:
            self._watcher = callback
            self._writer.armed = True

    async def wait_beyond(self, offset: int, next_offset) -> None:
        """Return once ``next_offset() > offset`` or the log is closed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            self._waiters.append((loop, fut))
            self._writer.armed = True
        if next_offset() > offset or self.closed:
            self.wake_all()
        await fut

    def wake_all(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher()
        if waiters:
            resolve_futures(waiters, None)

    def close(self) -> None:
        self.closed = True
        self.wake_all()
