"""A few threads shared by every log in the process for short background jobs.

Threads start when a job comes and there is no idle one (up to ``size``), and end after
``idle_s`` without work, so a process whose logs are idle has none, and a process with a
thousand logs has as many as a busy moment needs, not one per log.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Callable

log = logging.getLogger("danube.wal")


class WorkerPool:
    def __init__(self, size: int, name: str, *, idle_s: float = 10.0) -> None:
        self.size = size
        self.name = name
        self.idle_s = idle_s
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[..., Any], tuple]] = deque()
        self._threads = 0
        self._idle = 0
        self._pid = os.getpid()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            if self._pid != os.getpid():  # a forked child has none of the parent's threads
                self._pid, self._threads, self._idle = os.getpid(), 0, 0
            self._jobs.append((fn, args))
            # waiting threads (each takes one job when it wakes) fewer than the jobs: one more thread
            if self._idle < len(self._jobs) and self._threads < self.size:
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self.name}-{self._threads}", daemon=True).start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._idle += 1
                    woke = self._cond.wait(self.idle_s)
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1
                        return
                fn, args = self._jobs.popleft()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a job's failure is its own; the thread serves others
                log.exception("WAL: background job %r failed", fn)
