"""Appended frame batches of one topic waiting to become durable.

A batch-lane publish is appended at once, in the caller's turn of the event loop, and gets a
future instead of a task of its own.  When the storage calls the batch durable already
(``sync=never``, memory topics), the first such batch of a turn schedules one callback
(``call_soon``) for the topic, which makes every batch visible (in offset order), answers their
futures and wakes the subscriptions once, with no task and no await; otherwise the topic's one
waiter task asks the storage for the durability of the last batch appended and does the same,
going on while batches keep coming.  So a 2-message call costs a future and a share of one
callback, and a commit that covers several calls wakes the subscriptions once, not once per
call.  Nothing is held back: a batch is appended as soon as it arrives (unlike ``coalesce``,
which joins single messages), so batch order and offsets are exactly those of the appends.
Batches become visible in a later turn than the one that appended them, never in the appending
turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)

# producer (None: the broker's own records), first, last, bytes, when it was received, its future
_Pending = tuple["Producer | None", int, int, int, float, asyncio.Future]


class CommitQueue:
    __slots__ = ("topic", "_pending", "_waiting", "_scheduled", "waits")

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._pending: deque[_Pending] = deque()  # appended, not yet durable, in offset order
        self._waiting: asyncio.Task | None = None
        self._scheduled = False  # a ``_settle`` callback is due this turn
        self.waits = 0  # commit rounds (a durability check or wait each; for tests and stats)

    def add(self, producer: "Producer | None", first: int, last: int, nbytes: int, started: float) -> asyncio.Future:
        """``first..last`` was just appended; the future resolves to ``(first, last)`` once it is
        durable and visible to subscribers, or fails as the storage's wait failed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((producer, first, last, nbytes, started, fut))
        if not self._scheduled and self._waiting is None:  # (else a callback or the task takes it)
            if self.topic.storage.durable_now(last):
                self._scheduled = True
                loop.call_soon(self._settle)
            else:  # the sync is asked for at once, as before there was a callback
                self._waiting = loop.create_task(self._run())
        return fut

    def _settle(self) -> None:
        """The turn after an append that was durable at once: commit what is durable, else (a
        later batch of the turn is not) start the waiter task."""
        self._scheduled = False
        pending = self._pending
        if self._waiting is not None or not pending:
            return
        target = pending[-1][2]
        if not self.topic.storage.durable_now(target):
            self._waiting = asyncio.get_running_loop().create_task(self._run())
            return
        self.waits += 1
        try:
            self._commit(target)
        except Exception as exc:  # noqa: BLE001 - a bug: the batches it covered hear it, not the loop
            log.exception("commit of %s through offset %d failed", self.topic.name, target)
            self._fail(target, exc)

    def _commit(self, target: int) -> None:
        """Every pending batch through ``target`` is durable: visible, counted and answered
        (made visible at once, the publish latency observed per batch)."""
        topic = self.topic
        pending = self._pending
        published = topic.metrics.published
        name = topic.name
        now = time.perf_counter()
        messages = nbytes_all = 0
        while pending and pending[0][2] <= target:
            producer, first, last, nbytes, started, fut = pending.popleft()
            count = last - first + 1
            messages += count
            nbytes_all += nbytes
            published(name, count, nbytes, (now - started) * 1000)
            if producer is not None:
                producer.messages_in += count
                producer.bytes_in += nbytes
            if not fut.done():
                fut.set_result((first, last))
        if messages:
            topic.made_visible(messages, nbytes_all, target)

    def _fail(self, target: int, exc: BaseException) -> None:
        pending = self._pending
        while pending and pending[0][2] <= target:
            fut = pending.popleft()[5]
            if not fut.done():
                if isinstance(exc, asyncio.CancelledError):
                    fut.cancel()
                else:
                    fut.set_exception(exc)

    async def _run(self) -> None:
        storage = self.topic.storage
        pending = self._pending
        try:
            while pending:
                target = pending[-1][2]
                self.waits += 1
                try:
                    await storage.wait_durable(target)
                except BaseException as exc:  # noqa: BLE001 - every batch the wait covered hears it
                    self._fail(target, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                self._commit(target)
        finally:
            self._waiting = None
            while pending:  # cancelled with batches left (broker stop): they hear it too
                fut = pending.popleft()[5]
                if not fut.done():
                    fut.cancel()
