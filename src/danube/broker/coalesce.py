"""Coalescing single-message publishes (Danube's unary ``SendMessage``) into frame batches.

Danube's clients send one unary call per message.  Storing each call on its
own would cost one append, one durability wait (a future handed over by the
WAL's sync thread) and one dispatch wake-up per message.  Instead:

- the calls that reach a topic during one event-loop iteration are joined into
  one frame batch and stored with one ``append_frames`` (the flush runs on the
  next iteration, ``call_soon``, after the handlers already scheduled);
- at most one durability wait per topic is in flight.  It waits for the
  highest offset appended so far, so every batch appended meanwhile is covered
  by the same wait (group commit ahead of the WAL's own), then answers every
  call of those batches with its offset, wakes the subscriptions once, and
  waits again if more was appended in the meantime.

No timer is involved: an idle topic stores a lone call on the next iteration,
and a busy one shares each fdatasync among everything that arrived while the
previous one ran.  Batches are appended in submission order, so one producer's
messages keep their order, and each call is answered only once its message is
durable under the sync policy.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic

_Waiter = tuple["Producer", int, asyncio.Future]   # producer, frame size, the call's future


class _Appended:
    __slots__ = ("first", "last", "nbytes", "started", "waiters")

    def __init__(self, first: int, last: int, nbytes: int, started: float, waiters: list[_Waiter]) -> None:
        self.first = first
        self.last = last
        self.nbytes = nbytes
        self.started = started
        self.waiters = waiters


class PublishCoalescer:
    """Joins the single-frame publishes submitted to one topic; shares their durability waits."""

    __slots__ = ("topic", "_frames", "_waiters", "_scheduled", "_appended", "_waiting", "batches", "messages",
                 "durability_waits")

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._frames: list = []
        self._waiters: list[_Waiter] = []
        self._scheduled = False
        self._appended: deque[_Appended] = deque()   # appended, not yet durable, in offset order
        self._waiting: asyncio.Task | None = None      # the one durability wait in flight
        self.batches = 0            # frame batches appended (for tests and stats)
        self.messages = 0           # messages appended through them
        self.durability_waits = 0   # wait_durable calls made for them

    def submit(self, producer: "Producer", frame) -> asyncio.Future:
        """Queue one whole, unstamped frame; the future resolves to its offset once durable.

        The caller has checked the frame's size against the topic's policy.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._frames.append(frame)
        self._waiters.append((producer, len(frame), fut))
        if not self._scheduled:
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
        except BaseException as exc:  # noqa: BLE001 - nothing of the batch was stored; each call hears why
            _fail(waiters, exc)
            return
        self.batches += 1
        self.messages += len(waiters)
        self._appended.append(_Appended(first, last, len(buf), started, waiters))
        if self._waiting is None:
            self._waiting = asyncio.get_running_loop().create_task(self._wait_durable())

    async def _wait_durable(self) -> None:
        topic = self.topic
        try:
            while self._appended:
                target = self._appended[-1].last
                self.durability_waits += 1
                try:
                    await topic.storage.wait_durable(target)
                except BaseException as exc:  # noqa: BLE001 - every call appended so far hears it
                    while self._appended:
                        _fail(self._appended.popleft().waiters, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return
                while self._appended and self._appended[0].last <= target:
                    done = self._appended.popleft()
                    topic.committed(done.last - done.first + 1, done.nbytes, done.last, done.started,
                                    notify=False)
                    offset = done.first
                    for producer, size, fut in done.waiters:
                        producer.messages_in += 1
                        producer.bytes_in += size
                        if not fut.done():
                            fut.set_result(offset)
                        offset += 1
                topic.notify_subscriptions()
        finally:
            self._waiting = None


def _fail(waiters: list[_Waiter], exc: BaseException) -> None:
    for _producer, _size, fut in waiters:
        if not fut.done():
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
