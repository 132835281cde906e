"""Waiting on many consumers at once: one waiter and one wake for every consumer with batches.

An application reading a hundred topics with a task per consumer pays a task wake-up per delivery
per consumer.  A :class:`ConsumerSet` is told by each consumer's inbox when a batch arrives, keeps
the consumers that have something in arrival order, and wakes its one reader once: that reader then
takes what every ready consumer has (``Consumer.receive_ready``), however many deliveries came in
the same loop turn.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Iterable

from danube._tasks import wake
from danube.client.consumer import Consumer
from danube.client.messages import MessageBatch


class ConsumerSet:
    """Subscribed consumers read together: ``await receive()`` gives ``(consumer, batches)`` pairs.

    The batches a ``receive`` returns are held (their credit does not go back) until the set's
    next ``receive``, as with ``Consumer.receive_batch``; ack them with the consumer they came
    with.  A consumer that was closed leaves the set; one that failed raises its error from every
    ``receive`` without batches of other consumers, until it is removed."""

    def __init__(self, consumers: Iterable[Consumer]) -> None:
        self._consumers = list(consumers)
        self._ready: deque[Consumer] = deque()
        self._marked: set[Consumer] = set()  # the consumers in _ready
        self._waiter: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the reader's, once it asked
        # Consumers whose batches the last receive returned: their credit goes back at the next
        # receive, whether or not they have more by then.  (Given back only by a consumer's own
        # next take, a reader that took a consumer's whole window at once would wait forever: the
        # broker has no credit left to send the delivery that would make it take again.)
        self._holding: list[Consumer] = []
        for consumer in self._consumers:
            if consumer._queue.listener is not None:
                raise ValueError(f"consumer {consumer.name} already belongs to a consumer set")
            consumer._queue.listener = self._listener(consumer)
            if not consumer._queue.empty():
                self._mark(consumer)

    def __len__(self) -> int:
        return len(self._consumers)

    def _listener(self, consumer: Consumer):
        def arrived() -> None:
            marked = self._marked
            if consumer not in marked:  # self._mark(consumer), inline: once per delivered batch
                marked.add(consumer)
                self._ready.append(consumer)
                waiter = self._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

        return arrived

    def _mark(self, consumer: Consumer) -> None:
        self._marked.add(consumer)
        self._ready.append(consumer)
        waiter = self._waiter
        if waiter is not None:
            wake(waiter)

    async def receive(self, timeout: float | None = None) -> list[tuple[Consumer, list[MessageBatch]]]:
        """Every consumer's batches that arrived, waiting for the first; ``[]`` after ``timeout``
        seconds without any, or once every consumer of the set is closed."""
        loop = self._loop
        if loop is None:  # kept: asyncio.get_running_loop() asks the kernel for the pid (CPython 3.11)
            loop = self._loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        holding, self._holding = self._holding, []
        for consumer in holding:
            consumer._give_back()
        while self._consumers:
            if not self._ready:
                if deadline is not None and loop.time() >= deadline:
                    return []
                await self._wait(loop, deadline)
                continue
            taken = self._take()
            if taken:
                return taken
        return []

    async def _wait(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        waiter = self._waiter = loop.create_future()
        timer = None if deadline is None else loop.call_at(deadline, wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _take(self) -> list[tuple[Consumer, list[MessageBatch]]]:
        ready, self._ready = self._ready, deque()
        marked = self._marked
        taken: list[tuple[Consumer, list[MessageBatch]]] = []
        failed: BaseException | None = None
        for consumer in ready:
            marked.discard(consumer)
            try:
                batches = consumer.receive_ready()
            except BaseException as error:
                failed = failed or error
                self._mark(consumer)  # raised by every later call, until removed
                continue
            if batches is None:  # closed: it leaves the set
                self.remove(consumer)
            elif batches:
                taken.append((consumer, batches))
                self._holding.append(consumer)
        if failed is not None and not taken:
            raise failed
        return taken

    def remove(self, consumer: Consumer) -> None:
        """``consumer`` leaves the set (it stays open; batches it delivered stay with it)."""
        if consumer._queue.listener is not None:
            consumer._queue.listener = None
        if consumer in self._consumers:
            self._consumers.remove(consumer)
        if consumer in self._marked:
            self._marked.discard(consumer)
            self._ready.remove(consumer)

    def close(self) -> None:
        """The consumers stop telling the set of their deliveries (they stay open)."""
        for consumer in list(self._consumers):
            self.remove(consumer)
