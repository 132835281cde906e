"""A partition's send queue and in-flight window, and what goes into one ``Publish`` request.

Both have exactly one waiter, the stream's writer, so they keep a counter or a deque and at most
one future: ``asyncio.Queue`` and ``asyncio.Semaphore`` cost a getter loop, a waiter deque and
(``Semaphore.locked``) a generator scan per call, and ``Event.wait``/``get_running_loop`` a
``getpid`` system call, which showed in the profile of many small publish calls.

Batches queued behind the one being written go out in the same request (their frames joined,
one sequence, one ack) as long as they were routed under the same partitioning version and the
request stays within ``max_batch_bytes``: when the writer falls behind (the event loop is busy,
or the window was full) it catches up with fewer, larger requests instead of one gRPC write and
one ack per batch.  Nothing waits to be merged: a batch alone in the queue goes out alone.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from danube.client.producer_batch import Batch


def _running_loop(owner: "SendQueue | Window") -> asyncio.AbstractEventLoop:
    # kept: asyncio.get_running_loop() asks the kernel for the pid on every call (CPython 3.11)
    owner._loop = loop = asyncio.get_running_loop()
    return loop


class SendQueue:
    """FIFO of ``(sequence, batch)`` and markers, read by one task."""

    __slots__ = ("_items", "_waiter", "_loop")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the reader's, once it waited

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def idle(self) -> bool:
        """The reader waits for an item (everything it took before is dealt with) and none is queued."""
        waiter = self._waiter
        return waiter is not None and not waiter.done() and not self._items

    def get_nowait(self) -> Any:
        return self._items.popleft()  # IndexError when empty

    def peek(self) -> Any:
        """The next item, or None when empty."""
        return self._items[0] if self._items else None

    async def get(self) -> Any:
        items = self._items
        while not items:
            loop = self._loop or _running_loop(self)
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return items.popleft()


class Window:
    """At most ``size`` requests awaiting their ack; acquired by one task."""

    __slots__ = ("free", "size", "_waiter", "_loop")

    def __init__(self, size: int) -> None:
        self.free = self.size = size
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def below(self, limit: int) -> None:
        """Waits until fewer than ``limit`` requests await their ack."""
        while self.size - self.free >= limit:
            loop = self._loop or _running_loop(self)
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def release(self) -> None:
        self.free += 1
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def acquire(self) -> None:
        while self.free <= 0:
            loop = self._loop or _running_loop(self)
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self.free -= 1


def coalesce(
    seq: int,
    batch: Batch,
    queue: SendQueue,
    unacked: dict[int, Batch],
    encode: Callable[[Batch], bytes],
    limit: int,
) -> tuple[bytes, list[tuple[int, int]] | None]:
    """The frames of one request led by ``batch`` (sequence ``seq``), with the batches queued right
    behind it that fit; and, when it took any, the request's batches as ``(sequence, messages)``
    in order, which is how its ack's offsets are split among them."""
    frames = encode(batch)
    batch.sent_at = now = time.perf_counter()
    parts: list[bytes] | None = None
    members: list[tuple[int, int]] | None = None
    size = len(frames)
    version = batch.version
    while True:
        item = queue.peek()
        if type(item) is not tuple:  # empty, or a marker the writer must see
            break
        next_seq, nxt = item
        if next_seq not in unacked:  # acked meanwhile by an earlier stream
            queue.get_nowait()
            continue
        if nxt.version != version:
            break
        more = encode(nxt)  # kept on the batch: not encoded again when it leads the next request
        if size + len(more) > limit:
            break
        queue.get_nowait()
        nxt.sent_at = now
        if parts is None or members is None:
            parts, members = [frames], [(seq, len(batch.payloads))]
        parts.append(more)
        members.append((next_seq, len(nxt.payloads)))
        size += len(more)
    if parts is None:
        return frames, None
    return b"".join(parts), members
