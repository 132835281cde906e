"""Appended frame batches of one topic waiting to become durable, and the loop turn that commits
the topics appended to.

A batch-lane publish is appended at once, in the caller's turn of the event loop, and gets either
a future (the awaitable API) or, on the batch lane's per-call path, no object at all: the commit
calls the caller's ``answer(tag, producer_id, first, last, error)`` itself when it commits or
fails the batch, and tells the broker how many such answers it gave (its count of publishes in
flight, which a drain waits for) once per commit.

The first batch of a topic with no durability wait out puts the topic's queue on the broker's
:class:`CommitTurn`; the first queue of a turn schedules the turn's one callback (``call_soon``)
for every topic appended to meanwhile, after the turn's appends.  There, a topic whose storage
calls the last batch durable already (``sync=never``, memory topics) makes every batch visible (in
offset order), answers them and wakes the subscriptions once, with no task and no await.
Otherwise the topic asks the storage once for the durability of the last batch appended
(``when_durable``: one wait for all of its batches) and is called back on the loop when the sync
covering it is done -- the WAL's group commit answers every topic of a round with one hand-off to
the loop; batches appended while that sync is in flight are asked for together when it returns.
So with many topics a turn costs one callback however many topics it commits, a commit one call to
the metrics and one to the broker's count, and a 2-message call no future and no callback of its
own.  Nothing is held back: a batch is appended as soon as it arrives (unlike ``coalesce``, which
joins single messages), so batch order and offsets are exactly those of the appends.  Batches
become visible in a later loop callback than the publish call that appended them, never inside
it, and never before the storage called them durable: an ack is never sent ahead of the sync it
promises.

A storage without ``when_durable`` (the contract's ``wait_durable`` only) is waited for by a
task per commit instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Union

from danube.broker.stats import LATENCY_BUCKETS_MS

if TYPE_CHECKING:
    from danube.broker.producer import Producer
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)

# answer(tag, producer_id, first, last, error): error None (committed) or what failed the batch
# (CancelledError: the broker is stopping)
Answer = Callable[[int, int, int, int, Union[BaseException, None]], None]

# producer (None: the broker's own records), first, last, bytes, when it was received, then its
# future and None, or the caller's answer and its tag
_Pending = tuple["Producer | None", int, int, int, float, Any, "int | None"]


_UNASKED = object()


def _uncounted(_answered: int) -> None:
    pass


class CommitTurn:
    """The commit queues of one broker (one event loop) that have batches to settle in the next
    turn, settled by one loop callback; ``answered(n)`` hears how many batches were answered by
    callback (the broker's count of publishes in flight)."""

    __slots__ = ("_due", "_scheduled", "answered")

    def __init__(self, answered: Callable[[int], None] | None = None) -> None:
        self._due: list[CommitQueue] = []
        self._scheduled = False
        self.answered = answered or _uncounted

    def due(self, queue: "CommitQueue") -> None:
        self._due.append(queue)
        if not self._scheduled:
            # once the turn's appends are done: one wait covers each topic's batches, and the sync
            # threads are not woken while the loop is still appending
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        """Each due topic: commit what is durable already, else ask its storage once for the last
        batch appended (inline here, not a method call per topic: the per-turn path)."""
        self._scheduled = False
        due = self._due
        self._due = []  # (a queue made due by what this callback does goes to the next one)
        for queue in due:
            queue._scheduled = False
            pending = queue._pending
            if queue._waiting_for is not None or not pending:
                continue
            target = pending[-1][2]
            try:
                if not queue.topic.storage.durable_now(target):
                    queue._wait(target, asyncio.get_running_loop())
                    continue
                queue.waits += 1
                queue._commit(target)
            except Exception as exc:  # noqa: BLE001 - a bug: this topic's batches hear it, not the loop
                log.exception("commit of %s through offset %d failed", queue.topic.name, target)
                queue._fail(target, exc)


class CommitQueue:
    __slots__ = ("topic", "turn", "_pending", "_waiting_for", "_scheduled", "_row", "waits")

    def __init__(self, topic: "Topic", turn: CommitTurn | None = None) -> None:
        self.topic = topic
        self.turn = turn if turn is not None else CommitTurn()
        self._pending: deque[_Pending] = deque()  # appended, not yet durable, in offset order
        self._waiting_for: int | None = None  # the offset a durability wait is out for
        self._scheduled = False  # on the turn's list of queues to settle
        # the topic's publish counters (MetricsSink.published_counts, asked at the first commit:
        # a topic nothing was published to has none), added to once per commit; None: the sink
        # is called per batch
        self._row: Any = _UNASKED  # (a list, None, or _UNASKED)
        self.waits = 0  # commit rounds (a durability check or wait each; for tests and stats)

    def add(self, producer: "Producer | None", first: int, last: int, nbytes: int, started: float) -> asyncio.Future:
        """``first..last`` was just appended; the future resolves to ``(first, last)`` once it is
        durable and visible to subscribers, or fails as the storage's wait failed."""
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((producer, first, last, nbytes, started, fut, None))
        if not self._scheduled and self._waiting_for is None:  # (else the turn or a wait takes it)
            self._scheduled = True
            self.turn.due(self)
        return fut

    def add_answered(
        self, producer: "Producer | None", first: int, last: int, nbytes: int, started: float, answer: Answer, tag: int
    ) -> None:
        """:meth:`add` without a future: ``answer(tag, producer.id, first, last, None)`` (producer
        id 0 for the broker's own records) once it is
        durable and visible, ``answer(tag, producer.id, first, last, error)`` if it fails; exactly
        once either way, and counted to ``turn.answered`` right after."""
        self._pending.append((producer, first, last, nbytes, started, answer, tag))
        if not self._scheduled and self._waiting_for is None:
            self._scheduled = True
            self.turn.due(self)

    def answer_when_done(self, producer: "Producer | None", fut: asyncio.Future, answer: Answer, tag: int) -> None:
        """The answer of a publish that took a task (a rate-limited topic): from its future."""

        def done(fut: asyncio.Future) -> None:
            exc: BaseException | None = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            first, last = fut.result() if exc is None else (-1, -1)
            self._answer(answer, tag, producer, first, last, exc)
            self.turn.answered(1)

        fut.add_done_callback(done)

    def _answer(
        self, answer: Answer, tag: int, producer: "Producer | None", first: int, last: int, exc: BaseException | None
    ) -> None:
        try:
            answer(tag, producer.id if producer is not None else 0, first, last, exc)
        except Exception:  # noqa: BLE001 - the caller's bug: the other batches are still answered
            log.exception("answer of a publish to %s failed", self.topic.name)

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
            try:  # (``_commit_or_fail``, inline: once per topic per round)
                self._commit(target)
            except Exception as failed:  # noqa: BLE001 - a bug: the batches it covered hear it, not the loop
                log.exception("commit of %s through offset %d failed", self.topic.name, target)
                self._fail(target, failed)
        elif isinstance(exc, asyncio.CancelledError):  # the broker is stopping: no new wait
            self._fail(pending[-1][2] if pending else target, exc)
            return
        else:
            self._fail(target, exc)
        if pending:
            last = pending[-1][2]
            try:
                durable = self.topic.storage.durable_now(last)
            except Exception as exc:  # noqa: BLE001 - a bug: the batches hear it, not the loop
                log.exception("durability check of %s failed", self.topic.name)
                self._fail(last, exc)
                return
            if durable:  # appended in earlier turns: commit now
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
        (made visible at once; the publish latency observed per batch, the counters added to
        once)."""
        topic = self.topic
        pending = self._pending
        row = self._row
        if row is _UNASKED:
            row = self._row = topic.metrics.published_counts(topic.name)
        now = time.perf_counter()
        messages = nbytes_all = answered = 0
        latency_sum = 0.0
        bounds = LATENCY_BUCKETS_MS
        bucket = bisect_left
        popleft = pending.popleft
        try:
            while pending and pending[0][2] <= target:
                producer, first, last, nbytes, started, answer, tag = popleft()
                count = last - first + 1
                messages += count
                nbytes_all += nbytes
                latency = (now - started) * 1000
                if row is not None:
                    latency_sum += latency
                    row[3 + bucket(bounds, latency)] += 1
                else:
                    topic.metrics.published(topic.name, count, nbytes, latency)
                if producer is not None:
                    producer.messages_in += count
                    producer.bytes_in += nbytes
                if tag is None:
                    if not answer.done():
                        answer.set_result((first, last))
                else:
                    answered += 1
                    try:  # (``_answer``, inline: the per-call path)
                        answer(tag, producer.id if producer is not None else 0, first, last, None)
                    except Exception:  # noqa: BLE001 - the caller's bug: the other batches are still answered
                        log.exception("answer of a publish to %s failed", topic.name)
        finally:
            if row is not None and messages:
                row[0] += messages
                row[1] += nbytes_all
                row[2] += latency_sum
            if answered:
                self.turn.answered(answered)
        if messages:
            topic.made_visible(messages, nbytes_all, target)

    def _fail(self, target: int, exc: BaseException) -> None:
        pending = self._pending
        answered = 0
        try:
            while pending and pending[0][2] <= target:
                producer, first, last, _nbytes, _started, answer, tag = pending.popleft()
                if tag is not None:
                    answered += 1
                    self._answer(answer, tag, producer, first, last, exc)
                elif not answer.done():
                    if isinstance(exc, asyncio.CancelledError):
                        answer.cancel()
                    else:
                        answer.set_exception(exc)
        finally:
            if answered:
                self.turn.answered(answered)
