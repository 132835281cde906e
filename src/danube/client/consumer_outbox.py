"""What one partition consumer sends on its ``Consume`` stream: credit, acks and nacks, in order.

Acks wait as plain ``[first, last]`` pairs, merged while they wait, and become one ``AckBatch``
request only when the stream's writer takes them, encoded to bytes directly
(``requests_wire.ack_request``): an ack costs no protobuf object.
An ack run lingers (so the acks of the next few batches join it) until the linger ticker of its
event loop releases it, until it covers ``max_messages`` (acks held longer than that would hold
deliveries back at the broker's unacked window), or until something queued after it (a credit
grant, a nack, the end of the stream) has to go out anyway.  One ticker serves every consumer of
a loop with the same linger: runs are released in the order they started, each once its linger
is over give or take a quarter of it, so there is one timer for many streams instead of one per
ack, and the writes of many streams go out in the same loop turn (the transport then sends them
together).

The outbox outlives its streams: what a broken stream did not write goes out on the next one
(credit grants excepted: a new stream starts with the whole window).  ``flush()`` releases what
lingers and queues a marker the writer resolves once everything before it is written.

On the h2 transport a stream's writer lends the outbox its call's ``write_nowait``: while the
writer waits, a request that becomes ready is written by whoever made it ready (the linger
ticker, an ack past ``max_messages``, a credit grant) in the same order, and the writer's task is
woken only for what has to wait.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from danube.client.requests_wire import ack_request
from danube.proto.danube_batch import batch_pb2 as pb

# Ends the stream's requests (put by close()): the writer half-closes after what is queued before it.
END = object()


class _AckRun:
    """Acks queued one after another, as merged ``[first, last]`` pairs in the order they came."""

    __slots__ = ("ranges", "due", "messages")

    def __init__(self) -> None:
        self.ranges: list[list[int]] = []
        self.due = False  # released by the ticker (or sent early, behind a later request)
        self.messages = 0


class _Flushed:
    """A marker in the queue: its future is resolved when the writer reaches it."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future) -> None:
        self.future = future


class _Ticker:
    """Releases the lingering acks of every outbox of one loop and one linger, on one timer.

    All runs linger equally long, so the order they start in is the order they are due: a FIFO,
    and one timer armed for its head.  A firing also releases the runs due within a quarter of
    the linger, so one firing serves many streams."""

    __slots__ = ("_loop", "_linger", "_slack", "_waiting", "_handle")

    def __init__(self, loop: asyncio.AbstractEventLoop, linger: float) -> None:
        self._loop = loop
        self._linger = linger
        self._slack = linger / 4
        self._waiting: deque[tuple[float, Outbox]] = deque()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, outbox: "Outbox") -> None:
        due = self._loop.time() + self._linger
        self._waiting.append((due, outbox))
        if self._handle is None:
            self._handle = self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        waiting = self._waiting
        until = self._loop.time() + self._slack
        while waiting and waiting[0][0] <= until:
            waiting.popleft()[1]._release()
        self._handle = self._loop.call_at(waiting[0][0], self._fire) if waiting else None


_tickers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, _Ticker]]" = weakref.WeakKeyDictionary()


def _ticker(linger: float) -> _Ticker:
    loop = asyncio.get_running_loop()
    by_linger = _tickers.get(loop)
    if by_linger is None:
        by_linger = _tickers[loop] = {}
    ticker = by_linger.get(linger)
    if ticker is None:
        ticker = by_linger[linger] = _Ticker(loop, linger)
    return ticker


class Outbox:
    """The requests one partition consumer has not written yet, and the one writer waiting for them."""

    __slots__ = ("_items", "_waiter", "_linger", "_max_messages", "_ticker", "_ticking", "_loop", "direct")

    def __init__(self, linger_s: float, max_messages: int) -> None:
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._linger = linger_s
        self._max_messages = max_messages
        self._ticker: _Ticker | None = None  # its loop's, taken at the first ack
        self._ticking = False  # waiting on the ticker already
        # the writer's loop, kept once it waited: asyncio.get_running_loop() asks the kernel for
        # the pid on every call (CPython 3.11), and the writer waits once per request
        self._loop: asyncio.AbstractEventLoop | None = None
        # the stream's ``write_nowait`` (h2 transport), set by its writer: while the writer waits,
        # what becomes ready is written at once instead of waking the writer's task
        self.direct: Callable[[Any], bool] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def push(self, request) -> None:
        """A credit grant or a nack (or END): written as soon as the writer gets to it."""
        self._items.append(request)
        self._wake()

    def ack(self, first: int, last: int) -> None:
        """Acks ``[first, last]``: joins the acks waiting at the end of the queue, or starts a run."""
        items = self._items
        run = items[-1] if items else None
        wake = False
        if type(run) is not _AckRun:
            run = _AckRun()
            items.append(run)
            if not self._linger:
                # the writer's task takes it: the acks of this loop turn join the run meanwhile
                run.due = True
                waiter = self._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            elif not self._ticking:
                self._ticking = True
                ticker = self._ticker
                if ticker is None:
                    ticker = self._ticker = _ticker(self._linger)
                ticker.add(self)
        ranges = run.ranges
        if ranges and ranges[-1][1] + 1 == first:
            ranges[-1][1] = last
        else:
            ranges.append([first, last])
        run.messages += last - first + 1
        if run.messages >= self._max_messages and not run.due:
            run.due = wake = True
        if wake:  # once the run holds this ack: a lent write_nowait writes it now
            self._wake()

    def restart(self, credit: pb.ConsumeRequest) -> None:
        """For a new stream: the old stream's credit grants are void, its acks and nacks still go
        out (before the new stream's whole-window ``credit``)."""
        kept = deque(
            item
            for item in self._items
            if type(item) is _AckRun or type(item) is _Flushed or item is END or not item.HasField("credit")
        )
        kept.append(credit)
        self._items = kept

    def _release(self) -> None:
        self._ticking = False
        self._all_due()

    def _all_due(self) -> None:
        for item in self._items:
            if type(item) is _AckRun:
                item.due = True
        self._wake()

    def flush(self) -> asyncio.Future:
        """Sends what lingers now; the future is done once everything queued so far is written
        (on this stream or, if it breaks, on the next one)."""
        future = asyncio.get_running_loop().create_future()
        if not self._items:
            future.set_result(None)
            return future
        self._items.append(_Flushed(future))
        self._all_due()
        return future

    def abandon(self, error: BaseException) -> None:
        """No writer will come (the consumer closed or gave up): flushes waiting fail with ``error``."""
        for item in self._items:
            if type(item) is _Flushed and not item.future.done():
                item.future.set_exception(error)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self.direct is not None and self._write_direct(self.direct):
                return
            waiter.set_result(None)

    def _write_direct(self, write: Callable[[Any], bool]) -> bool:
        """What ``next()`` would hand the waiting writer, written through ``write`` in the same
        order: True when nothing ready is left; False when the writer must take the rest (the
        end of the stream, or a request ``write`` could not write without waiting)."""
        items = self._items
        while self._ready():
            item = items[0]
            if item is END:
                return False
            kind = type(item)
            if kind is _Flushed:
                items.popleft()
                if not item.future.done():
                    item.future.set_result(None)
                continue
            if not write(ack_request(item.ranges) if kind is _AckRun else item):
                return False
            items.popleft()
        return True

    def _ready(self) -> bool:
        items = self._items
        if not items:
            return False
        first = items[0]
        return type(first) is not _AckRun or first.due or len(items) > 1

    async def next(self) -> pb.ConsumeRequest | bytes | None:
        """The next request to write (an ack as its encoded bytes), once one may go out; None at
        END (which stays queued).

        The writer asks for the next request only once the previous one is written, so a flush
        marker at the head means everything before it is written."""
        while True:
            while not self._ready():
                loop = self._loop
                if loop is None:
                    loop = self._loop = asyncio.get_running_loop()
                waiter = self._waiter = loop.create_future()
                try:
                    await waiter
                finally:
                    if self._waiter is waiter:
                        self._waiter = None
            items = self._items  # restart() may have replaced it meanwhile
            item = items[0]
            if item is END:
                return None
            items.popleft()
            kind = type(item)
            if kind is _AckRun:
                return ack_request(item.ranges)
            if kind is not _Flushed:
                return item
            if not item.future.done():
                item.future.set_result(None)
