"""Appended frame batches of one topic waiting to become durable, with one waiter per topic.

A batch-lane publish is appended at once, in the caller's turn of the event loop, and gets a
future instead of a task of its own: the topic's one waiter task asks the storage for the
durability of the last batch appended, then makes every batch it covers visible (in offset
order), answers their futures and wakes the subscriptions once, and goes on while batches
keep coming.  So a 2-message call costs a future, not a task with its coroutine frames, and a
wait that covers several calls wakes the subscriptions once, not once per call.  Nothing is
held back: a batch is appended as soon as it arrives (unlike ``coalesce``, which joins single
messages), so batch order and offsets are exactly those of the appends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic

# producer (None: the broker's own records), first, last, bytes, when it was received, its future
_Pending = tuple["Producer | None", int, int, int, float, asyncio.Future]


class CommitQueue:
    __slots__ = ("topic", "_pending", "_waiting", "waits")

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._pending: deque[_Pending] = deque()  # appended, not yet durable, in offset order
        self._waiting: asyncio.Task | None = None
        self.waits = 0  # durability waits made (for tests and stats)

    def add(self, producer: "Producer | None", first: int, last: int, nbytes: int, started: float) -> asyncio.Future:
        """``first..last`` was just appended; the future resolves to ``(first, last)`` once it is
        durable and visible to subscribers, or fails as the storage's wait failed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((producer, first, last, nbytes, started, fut))
        if self._waiting is None:
            self._waiting = loop.create_task(self._run())
        return fut

    async def _run(self) -> None:
        topic = self.topic
        pending = self._pending
        try:
            while pending:
                target = pending[-1][2]
                self.waits += 1
                try:
                    await topic.storage.wait_durable(target)
                except BaseException as exc:  # noqa: BLE001 - every batch the wait covered hears it
                    while pending and pending[0][2] <= target:
                        fut = pending.popleft()[5]
                        if not fut.done():
                            if isinstance(exc, asyncio.CancelledError):
                                fut.cancel()
                            else:
                                fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                while pending and pending[0][2] <= target:
                    producer, first, last, nbytes, started, fut = pending.popleft()
                    topic.committed(last - first + 1, nbytes, last, started, notify=False)
                    if producer is not None:
                        producer.messages_in += last - first + 1
                        producer.bytes_in += nbytes
                    if not fut.done():
                        fut.set_result((first, last))
                topic.notify_subscriptions()
        finally:
            self._waiting = None
            while pending:  # cancelled with batches left (broker stop): they hear it too
                fut = pending.popleft()[5]
                if not fut.done():
                    fut.cancel()
