"""Coalescing single-message publishes (Danube's unary ``SendMessage``) into frame batches.

Danube's clients send one unary call per message.  Storing each call on its
own would cost one append, one durability wait (a future handed over by the
WAL's sync thread) and one dispatch wake-up per message.  Instead, per topic:

- while no durability wait is in flight, a call is appended on the next loop
  iteration (``call_soon``), together with whatever else arrived by then, so a
  lone call on an idle topic is stored at once;
- while a wait is in flight, calls are held (gRPC hands the server one call per
  loop iteration, so they arrive spread out); when the wait ends, everything
  held is appended as one frame batch with one ``append_frames`` and waited for
  with one ``wait_durable``: the group commit happens before the append, not
  only at the fdatasync.  Under ``sync=always`` holding costs little, since an
  fdatasync already running could not have covered them; past
  ``MAX_HELD_MESSAGES`` or ``MAX_HELD_BYTES`` the held calls are appended anyway
  and share the next wait;
- while calls keep coming, consecutive waits start at least
  ``MIN_WAIT_SPACING_S`` apart, so each fdatasync covers more calls.  When
  the event loop is saturated (a hold wakes up more than ``LATE_S`` after it
  was due) the spacing doubles, up to ``MAX_WAIT_SPACING_S``: every batch costs
  the broker a fixed few hundred microseconds of CPU (append, fdatasync, the
  hand-offs with the WAL's sync thread), so on a busy broker larger batches
  buy calls per second; it falls back to the minimum as soon as a wait
  answers fewer than ``BUSY_BATCH`` calls, so light traffic keeps the short hold.

Each call is answered with its offset once its batch is durable under the sync
policy, and the subscriptions are woken once per wait.
Batches are appended in submission order, so one producer's messages keep
their order.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic

_Waiter = tuple["Producer", int, asyncio.Future]  # producer, frame size, the call's future

# Calls held while a durability wait is in flight, before they are appended anyway.
MAX_HELD_MESSAGES = 4096
MAX_HELD_BYTES = 4 * 1024 * 1024
# While calls keep arriving, durability waits start at most this often: each fdatasync costs the
# broker kernel CPU (the journal commit), so on a busy topic a few ms of holding buys larger batches
# and more calls per second (like PostgreSQL's commit_delay).  A lone call on an idle topic never waits.
MIN_WAIT_SPACING_S = 0.003
MAX_WAIT_SPACING_S = 0.010
# A hold waking this late means the loop is saturated (uvloop timers have 1 ms resolution).
LATE_S = 0.002
# A wait answering fewer calls than this is light traffic: back to the minimum spacing.
BUSY_BATCH = 4


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

    __slots__ = (
        "topic",
        "_frames",
        "_waiters",
        "_held_bytes",
        "_scheduled",
        "_appended",
        "_waiting",
        "_spacing",
        "batches",
        "messages",
        "durability_waits",
    )

    def __init__(self, topic: "Topic") -> None:
        self.topic = topic
        self._frames: list = []
        self._waiters: list[_Waiter] = []
        self._held_bytes = 0
        self._scheduled = False
        self._appended: deque[_Appended] = deque()  # appended, not yet durable, in offset order
        self._waiting: asyncio.Task | None = None  # the one durability wait in flight
        self._spacing = MIN_WAIT_SPACING_S  # current least time between wait starts
        self.batches = 0  # frame batches appended (for tests and stats)
        self.messages = 0  # messages appended through them
        self.durability_waits = 0  # wait_durable calls made for them

    def submit(self, producer: "Producer", frame) -> asyncio.Future:
        """Queue one whole, unstamped frame; the future resolves to its offset once durable.

        The caller has checked the frame's size against the topic's policy.
        """
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        size = len(frame)
        waiters = self._waiters
        self._frames.append(frame)
        waiters.append((producer, size, fut))
        self._held_bytes += size
        if not self._scheduled and (
            self._waiting is None or len(waiters) >= MAX_HELD_MESSAGES or self._held_bytes >= MAX_HELD_BYTES
        ):
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._scheduled = False
        frames, waiters = self._frames, self._waiters
        self._frames, self._waiters, self._held_bytes = [], [], 0
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
        last_start = 0.0
        try:
            while True:
                if self._waiters and not self._scheduled and not self._appended:
                    spacing = max(self._spacing, MIN_WAIT_SPACING_S)
                    due = last_start + spacing
                    pause = due - time.perf_counter()
                    if pause > 0:
                        await asyncio.sleep(pause)
                        if time.perf_counter() - due > LATE_S:
                            self._spacing = min(spacing * 2, MAX_WAIT_SPACING_S)
                if self._waiters and not self._scheduled:
                    self._flush()  # what was held during the last wait becomes one batch
                if not self._appended:
                    break
                target = self._appended[-1].last
                last_start = time.perf_counter()
                self.durability_waits += 1
                try:
                    await topic.storage.wait_durable(target)
                except BaseException as exc:  # noqa: BLE001 - every call appended so far hears it
                    while self._appended:
                        _fail(self._appended.popleft().waiters, exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return
                answered = 0
                while self._appended and self._appended[0].last <= target:
                    done = self._appended.popleft()
                    answered += len(done.waiters)
                    topic.committed(done.last - done.first + 1, done.nbytes, done.last, done.started, notify=False)
                    offset = done.first
                    for producer, size, fut in done.waiters:
                        producer.messages_in += 1
                        producer.bytes_in += size
                        if not fut.done():
                            fut.set_result(offset)
                        offset += 1
                topic.notify_subscriptions()
                if answered < BUSY_BATCH:
                    self._spacing = MIN_WAIT_SPACING_S
        finally:
            self._waiting = None
            if self._waiters and not self._scheduled:  # held calls outlived a failed wait: store them now
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)


def _fail(waiters: list[_Waiter], exc: BaseException) -> None:
    for _producer, _size, fut in waiters:
        if not fut.done():
            if isinstance(exc, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(exc)
