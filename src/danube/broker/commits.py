"""Appended frame batches of one topic waiting to become durable.

A batch-lane publish is appended at once, in the caller's turn of the event loop, and gets a
future instead of a task of its own.  The first batch of a turn with no durability wait out
schedules one callback (``call_soon``) for the topic, after the turn's appends.  When the storage
calls the last batch durable already (``sync=never``, memory topics), it makes every batch
visible (in offset order), answers their futures and wakes the subscriptions once, with no task
and no await.  Otherwise the topic asks the storage once for the durability of the last batch
appended (``when_durable``: one wait for all of the turn's batches) and is called
back on the loop when the sync covering it is done -- the WAL's group commit answers every
topic of a round with one hand-off to the loop, so a commit costs a callback, not a task, a
future and a chain of coroutines; batches appended while that sync is in flight are asked for
together when it returns.  So a 2-message call costs a future and a share of one callback, and
a commit that covers several calls wakes the subscriptions once, not once per call.  Nothing is
held back: a batch is appended as soon as it arrives (unlike ``coalesce``, which joins single
messages), so batch order and offsets are exactly those of the appends.  Batches become visible
in a later turn than the one that appended them, never in the appending turn, and never before
the storage called them durable: an ack is never sent ahead of the sync it promises.

A storage without ``when_durable`` (the contract's ``wait_durable`` only) is waited for by a
task per commit instead.
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
    __slots__ = ("topic", "_pending", "_waiting_for", "_scheduled", "waits")

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._pending: deque[_Pending] = deque()  # appended, not yet durable, in offset order
        self._waiting_for: int | None = None  # the offset a durability wait is out for
        self._scheduled = False  # a ``_settle`` callback is due this turn
        self.waits = 0  # commit rounds (a durability check or wait each; for tests and stats)

    def add(self, producer: "Producer | None", first: int, last: int, nbytes: int, started: float) -> asyncio.Future:
        """``first..last`` was just appended; the future resolves to ``(first, last)`` once it is
        durable and visible to subscribers, or fails as the storage's wait failed."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((producer, first, last, nbytes, started, fut))
        if not self._scheduled and self._waiting_for is None:  # (else a callback or a wait takes it)
            # once the turn's appends are done: one wait covers them all, and the sync threads
            # are not woken while the loop is still appending
            self._scheduled = True
            loop.call_soon(self._settle)
        return fut

    def _settle(self) -> None:
        """The turn after the first append with no wait out: commit what is durable already,
        else ask for the last batch appended."""
        self._scheduled = False
        pending = self._pending
        if self._waiting_for is not None or not pending:
            return
        target = pending[-1][2]
        if not self.topic.storage.durable_now(target):
            self._wait(target, asyncio.get_running_loop())
            return
        self.waits += 1
        self._commit_or_fail(target)

    def _wait(self, target: int, loop: asyncio.AbstractEventLoop) -> None:
        """Ask the storage to call :meth:`_durable` once ``target`` is durable."""
        self._waiting_for = target
        self.waits += 1
        storage = self.topic.storage
        when_durable = getattr(storage, "when_durable", None)
        if when_durable is None:
            loop.create_task(self._wait_task(storage, target))
            return
        try:
            when_durable(target, self._durable)
        except Exception as exc:  # noqa: BLE001 - refused at once (the log closed): the batches hear it
            loop.call_soon(self._durable, exc)

    async def _wait_task(self, storage, target: int) -> None:
        try:
            await storage.wait_durable(target)
        except BaseException as exc:  # noqa: BLE001 - every batch the wait covered hears it
            self._durable(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self._durable(None)

    def _durable(self, exc: BaseException | None) -> None:
        """The storage's answer for ``_waiting_for`` (on the loop): commit or fail the batches it
        covers, then ask for the ones appended meanwhile."""
        target = self._waiting_for
        self._waiting_for = None
        pending = self._pending
        if target is None:
            return
        if exc is None:
            self._commit_or_fail(target)
        elif isinstance(exc, asyncio.CancelledError):  # the broker is stopping: no new wait
            self._fail(pending[-1][2] if pending else target, exc)
            return
        else:
            self._fail(target, exc)
        if pending:
            last = pending[-1][2]
            if self.topic.storage.durable_now(last):  # appended in earlier turns: commit now
                self.waits += 1
                self._commit_or_fail(last)
            else:
                self._wait(last, asyncio.get_running_loop())

    def _commit_or_fail(self, target: int) -> None:
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
