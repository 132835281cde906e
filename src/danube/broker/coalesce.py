"""Coalescing single-message publishes (Danube's unary ``SendMessage``) into frame batches.

Danube's clients send one unary call per message.  Storing each call on its
own costs one append, one durability wait and one dispatch wake-up per message;
instead, the calls that reach a topic during one event-loop iteration are
joined into one frame batch: one ``append_frames``, one ``wait_durable``, one
wake-up of the subscriptions, and every call is answered with its own offset
once the batch is durable.

No timer is involved.  While a batch waits for durability, new calls queue;
when it is durable the queue is stored as the next batch at once.  So an idle
topic stores a lone call on the next loop iteration (``call_soon``), and a busy
one forms batches as large as what arrived during one durability wait: the
group commit happens before the append, not only at the fdatasync, and costs
one append, one durability wait and one future hand-off per batch instead of
per message.  Messages are appended in submission order, so one producer's
messages keep their order.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic


class PublishCoalescer:
    """Joins the single-frame publishes submitted to one topic in one loop iteration."""

    __slots__ = ("topic", "_frames", "_waiters", "_scheduled", "_in_flight", "batches", "messages")

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._frames: list = []
        self._waiters: list[tuple["Producer", int, asyncio.Future]] = []
        self._scheduled = False
        self._in_flight = False  # a batch is appended and waiting for durability
        self.batches = 0    # frame batches stored (for tests and stats)
        self.messages = 0   # messages stored through them

    def submit(self, producer: "Producer", frame) -> asyncio.Future:
        """Queue one whole, unstamped frame; the future resolves to its offset once durable.

        The caller has checked the frame's size against the topic's policy.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._frames.append(frame)
        self._waiters.append((producer, len(frame), fut))
        if not self._scheduled and not self._in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        frames, waiters = self._frames, self._waiters
        self._frames, self._waiters = [], []
        if not waiters:
            return
        buf = bytearray().join(frames) if len(frames) > 1 else bytearray(frames[0])
        started = time.perf_counter()
        try:
            first, last = self.topic.append(buf)
        except BaseException as exc:  # noqa: BLE001 - nothing of the batch was stored; every call fails
            for _producer, _size, fut in waiters:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.batches += 1
        self.messages += len(waiters)
        self._in_flight = True
        asyncio.get_running_loop().create_task(self._complete(first, last, len(buf), started, waiters))

    async def _complete(self, first: int, last: int, nbytes: int, started: float,
                        waiters: list[tuple["Producer", int, asyncio.Future]]) -> None:
        try:
            try:
                await self.topic.commit(first, last, nbytes, started)
            finally:
                self._in_flight = False
                if self._waiters:
                    self._flush()   # what queued during the wait is the next batch
        except BaseException as exc:  # noqa: BLE001 - durability failed: every call of the batch hears it
            for _producer, _size, fut in waiters:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        offset = first
        for producer, size, fut in waiters:
            producer.messages_in += 1
            producer.bytes_in += size
            if not fut.done():
                fut.set_result(offset)
            offset += 1
