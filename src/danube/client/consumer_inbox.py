"""The consumer's inbox: delivered batches waiting for the application to ask for them.

Every partition's stream puts its batches here (``danube.client.consumer_stream``); the consumer
(``danube.client.consumer``) takes them in delivery order, waiting with an optional timeout.  A
listener (the ``ConsumerSet`` that waits on many consumers at once) is told of every item put, so
one waiter serves many inboxes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from danube._tasks import wake

# What Inbox.get returns once its timeout passed without an item.
TIMEOUT = object()


class Inbox:
    """Delivered batches waiting for the application (bounded by the credit, so unbounded here).

    Waiter futures and a timer instead of ``asyncio.wait_for(queue.get())``, which
    creates a task for every call that has to wait."""

    __slots__ = ("items", "_waiters", "listener")

    def __init__(self) -> None:
        self.items: deque = deque()  # read by Consumer.receive_ready directly (no call per batch)
        self._waiters: deque[asyncio.Future] = deque()
        self.listener: Callable[[], None] | None = None  # told of every item put

    def empty(self) -> bool:
        return not self.items

    def put_nowait(self, item) -> None:
        self.items.append(item)
        if self._waiters:
            self._wake_next()
        listener = self.listener
        if listener is not None:
            listener()

    def put_back(self, item) -> None:
        """``item`` first again, telling no one (it was taken and is handed back)."""
        self.items.appendleft(item)

    def get_nowait(self):
        return self.items.popleft()

    async def get(self, timeout: float | None = None):
        """The next item; ``TIMEOUT`` once ``timeout`` seconds passed without one."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self.items:
            if deadline is not None and loop.time() >= deadline:
                return TIMEOUT
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timer = None if deadline is None else loop.call_at(deadline, wake, waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and self.items:
                    self._wake_next()  # this waiter was woken for an item it will not take
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                if not waiter.done():
                    waiter.cancel()
                # _wake_next pops the waiter it wakes, a timeout or a cancellation does not; a failed
                # deque.remove would format the future's repr into its ValueError on every wake-up
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self.items.popleft()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
