"""Push delivery: a waiting receive whose stream can write at once is served from ``notify``.

A receive that waits with a ``push`` callback (see ``Subscription.receive``) is not woken for
fresh frames the storage has at hand: ``notify`` takes them for it, without an await or the
read lock (the event loop serializes it; the lock guards only reads that await), and hands them
to the stream, so a small batch costs no task wake-up and no coroutine chain.  The receive is
woken only when that cannot be done (the storage must be awaited, a read is in progress, a
redelivery is due, its stream cannot write now).

A base class of :class:`~danube.broker.subscription.Subscription`, which holds the state.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Callable

from danube._tasks import wake
from danube.broker.cursor import Run
from danube.broker.delivery import MUST_AWAIT, NOTHING, Delivery, MustAwait
from danube.broker.subscription_state import SubscriptionState

if TYPE_CHECKING:
    from danube.broker.ratelimit import TokenBucket
    from danube.broker.subscription import Consumer

# A push callback: given a fresh delivery (its frames, first and last offset, and count: offsets
# consecutive, none a redelivery), writes it and returns the stream's remaining (messages, bytes)
# credit, or None when it could not write it now.  (Its parts, not a Delivery: the delivery a
# stream writes at once needs no object; one is made only when the receive must return it.)
Push = Callable[["memoryview | bytes", int, int, int], "tuple[int, int] | None"]

# Rounds of one push pass: consumers with credit left take another delivery while rounds deliver
# (a backlog larger than one read); beyond, their receives are woken and go on reading.
_PUSH_ROUNDS = 8
_PUSHED = "pushed"
_IDLE = "idle"
_DONE = "done"

_NEVER = float("inf")

_monotonic = time.monotonic
_new = object.__new__


class PushEntry:
    """A receive waiting by push: its stream's callback and remaining credit, the stream epoch it
    serves (None: any) and its timer (the next redelivery or ack deadline) with when that fires
    (``time.monotonic()`` seconds; infinity without a timer)."""

    __slots__ = ("push", "max_messages", "max_bytes", "epoch", "timer", "fires_at")

    def __init__(self, push: Push, max_messages: int, max_bytes: int, epoch: int | None) -> None:
        self.push = push
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.epoch = epoch
        self.timer: asyncio.TimerHandle | None = None
        self.fires_at = _NEVER

    def set_timer(self, timer: asyncio.TimerHandle | None, fires_at: float) -> None:
        self.timer = timer
        self.fires_at = fires_at if timer is not None else _NEVER


class PushDelivery(SubscriptionState):
    if TYPE_CHECKING:  # what this part uses of the rest of Subscription, beyond SubscriptionState
        dispatch_limit: TokenBucket | None
        consumers: dict[int, Consumer]
        _counts: list[int] | None
        _blocked_logged: bool
        read_lock: asyncio.Lock
        _waiters: list[tuple[Consumer, asyncio.Future]]
        _push: dict[asyncio.Future, PushEntry]
        _pushing: bool
        _renotify: bool
        _turns: int

        def _next_timer(self) -> float | None: ...
        def _expire_due(self, now: float) -> None: ...

    def notify(self) -> None:
        """Something may be deliverable now: wake every waiting receive.

        A receive that waits with a ``push`` callback (a stream that can write at once) is served
        here instead, in this turn and without waking its task: its delivery is taken without an
        await and handed to ``push``.  It is woken only when that cannot be done (the storage must
        be awaited, a read is in progress, a redelivery is due, its stream cannot write now)."""
        if self._pushing:  # a push pass is running (a record it met was rejected): it wakes them after
            self._renotify = True
            return
        waiters = self._waiters
        if not waiters:
            return
        if len(waiters) == 1 and self._push and not self.read_lock.locked():
            self._push_single(waiters[0])  # (one consumer per topic, the usual case)
            return
        self._waiters = []
        if len(waiters) > 1:
            self.dispatcher.order_waiters(waiters)  # woken receivers fetch in this order
            if self._push and not self.read_lock.locked():
                waiters = self._push_pass(waiters)
        for _, waiter in waiters:
            wake(waiter)

    def _push_pass(self, waiters: list[tuple[Consumer, asyncio.Future]]) -> list[tuple[Consumer, asyncio.Future]]:
        """Serves the push receives among ``waiters`` (in their order, a round at a time while
        rounds deliver, so shared consumers take turns); returns the waiters to wake."""
        pushes = self._push
        woken: list[tuple[Consumer, asyncio.Future]] = []
        idle: list[tuple[Consumer, asyncio.Future]] = []
        pending = waiters
        self._pushing = True
        try:
            for _round in range(_PUSH_ROUNDS):
                more: list[tuple[Consumer, asyncio.Future]] = []
                for item in pending:
                    entry = pushes.get(item[1])
                    if entry is None:
                        woken.append(item)
                        continue
                    outcome = self._push_one(item[0], item[1], entry)
                    if outcome is _PUSHED:
                        more.append(item)
                    elif outcome is _IDLE:
                        idle.append(item)
                pending = more
                if not pending:
                    break
                if self.next_read >= self.topic.readable_next:  # nothing fresh left for another round
                    idle.extend(pending)
                    pending = []
                    break
                if len(pending) > 1:
                    self.dispatcher.order_waiters(pending)
            else:
                woken.extend(pending)  # still delivering: their tasks go on reading
                pending = []
        finally:
            self._pushing = False
        idle.extend(pending)
        if self._renotify:  # something changed under the pass: every receive looks again itself
            self._renotify = False
            return woken + idle
        self._waiters.extend(idle)
        return woken

    def _push_single(self, item: tuple[Consumer, asyncio.Future]) -> None:
        """:meth:`_push_pass` for the one waiting receive (``item``, the only entry of ``_waiters``),
        without the lists a round of several takes: it stays in ``_waiters`` while it has nothing
        more to take, and is woken when its task must go on itself."""
        consumer, waiter = item
        entry = self._push.get(waiter)
        if entry is None:
            self._waiters = []
            wake(waiter)
            return
        outcome: str | None = None
        # One consumer of a type that then delivers fresh frames in offset order with no rule of
        # its own (exclusive, failover, shared): the plain case may take the fast path.
        plain = len(self.consumers) == 1 and self.dispatcher.solo_in_order
        topic = self.topic
        self._pushing = True
        try:
            for _round in range(_PUSH_ROUNDS):
                outcome = self._push_fresh(consumer, waiter, entry) if plain else None
                if outcome is None:
                    outcome = self._push_one(consumer, waiter, entry)
                if outcome is not _PUSHED:
                    break
                if self.next_read >= topic.readable_next:  # nothing fresh left for another round
                    outcome = _IDLE
                    break
            else:
                outcome = None  # still delivering: its task goes on reading
        finally:
            self._pushing = False
        if self._renotify:  # something changed under the pass: the receive looks again itself
            self._renotify = False
            if outcome is _IDLE:
                outcome = None
        elif outcome is _IDLE:
            return  # it stays waiting
        self._waiters = []
        if outcome is None:
            wake(waiter)

    def _push_fresh(self, consumer: Consumer, waiter: asyncio.Future, entry: PushEntry) -> str | None:
        """:meth:`_push_one` in the plain case, inline: the receive's stream is current, nothing is
        due for redelivery or blocked, no early ack, gate or rate limit, and the fresh frames from
        the read position are in the storage's memory and decodable.  ``_PUSHED`` or ``_DONE`` as
        :meth:`_push_one`; None when it is not the plain case (then nothing was changed, and
        :meth:`_push_one` decides).  The caller checked that its consumer is the subscription's
        only one and that the dispatcher adds no rule of its own (``solo_in_order``)."""
        epoch = entry.epoch
        if (
            waiter.done()
            or consumer.closed
            or not consumer.active
            or (epoch is not None and epoch != consumer.epoch)
            or self.dispatch_limit is not None
            or self.early_acks
        ):
            return None
        topic = self.topic
        next_read = self.next_read
        visible = topic.readable_next - next_read
        if visible <= 0 or topic.delivery_gate is not None:
            return None
        now = _monotonic()
        reliable = self.reliable
        tracker = self.tracker
        if reliable:
            order = tracker.order
            if tracker.blocked or tracker.redeliveries or (order and order[0].deadline <= now):
                return None
            window = self.settings.max_unacked_messages - tracker.unacked
            if window <= 0:
                return None
            self._blocked_logged = False  # (as a read that finds the subscription unblocked)
            if window < visible:
                visible = window
        read_now = getattr(topic.storage, "read_deliverable_now", None)
        max_messages = entry.max_messages
        if visible < max_messages:
            max_messages = visible
        # the frames cut to the limits and checked for decodability, in one compiled call
        got = None if read_now is None else read_now(next_read, max_messages, entry.max_bytes)
        if got is None:
            return None
        view, count = got
        size = len(view)
        # Tracked and counted as _track_fresh and _count do.
        last = next_read + count - 1
        self.next_read = last + 1
        timeout = self.failure_policy.ack_timeout_ms / 1000
        if reliable:
            firsts = tracker._firsts
            if not firsts or next_read > firsts[-1]:
                # (``tracker.delivered`` of fresh frames, after every run in flight, inline: a
                # new run at the end of the tracker's three indexes of them)
                run = _new(Run)
                run.first = next_read
                run.last = last
                run.consumer_id = consumer.id
                run.deadline = now + timeout
                run.settled = None
                run.remaining = count
                firsts.append(next_read)
                tracker._runs[next_read] = run
                tracker.order.append(run)
                tracker.unacked += count
            else:
                tracker.delivered(next_read, last, consumer.id, now + timeout)
        else:
            tracker.cursor = last
        self._turns = turns = self._turns + 1
        consumer.last_turn = turns
        consumer.messages_out += count
        consumer.bytes_out += size
        counts = self._counts
        if counts is None:
            self.metrics.delivered(topic.name, self.name, count, size)
        else:
            counts[0] += count
            counts[1] += size
        room = entry.push(view, next_read, last, count)
        if room is None:  # not written: the receive returns it and its stream writes it
            waiter.set_result(Delivery(view, next_read, last, count))
            return _DONE
        # (``_pushed``, inline)
        messages, nbytes = room
        if messages <= 0 or nbytes <= 0:
            waiter.set_result(NOTHING)  # out of credit: the stream waits for more
            return _DONE
        entry.max_messages = messages
        entry.max_bytes = nbytes
        if reliable and entry.fires_at - now > timeout:
            self._rearm(waiter, entry)
        return _PUSHED

    def _push_one(self, consumer: Consumer, waiter: asyncio.Future, entry: PushEntry) -> str:
        """One delivery to a push receive: ``_PUSHED`` (written, it has credit left), ``_IDLE``
        (nothing for it now) or ``_DONE`` (its receive was resolved or woken)."""
        epoch = entry.epoch
        if waiter.done() or consumer.closed or not consumer.active or (epoch is not None and epoch != consumer.epoch):
            wake(waiter)
            return _DONE
        if self.dispatch_limit is not None:  # (a rate limit: the awaited fetch takes the tokens)
            wake(waiter)
            return _DONE
        now = time.monotonic()
        reliable = self.reliable
        if reliable:
            order = self.tracker.order
            if order and order[0].deadline <= now:
                self._expire_due(now)
        delivery = self.dispatcher.fetch_now(consumer, entry.max_messages, entry.max_bytes, now)
        if delivery is None:
            if reliable:  # (a nack or a taken-back delivery may be due sooner than its timer)
                self._rearm(waiter, entry)
            return _IDLE
        if delivery is MUST_AWAIT:
            wake(waiter)
            return _DONE
        self._count(consumer, delivery)
        room = entry.push(delivery.frames, delivery.first_offset, delivery.last_offset, delivery.count)
        if room is None:  # not written: the receive returns it and its stream writes it
            waiter.set_result(delivery)
            return _DONE
        rearm = reliable and entry.fires_at - now > self.failure_policy.ack_timeout_ms / 1000
        return self._pushed(waiter, entry, room, now, rearm)

    def _pushed(self, waiter: asyncio.Future, entry: PushEntry, room: tuple[int, int], now: float, rearm: bool) -> str:
        """After a delivery its stream wrote: ``_PUSHED`` while the consumer has credit left,
        else ``_DONE`` (its stream waits for more).  ``rearm``: the entry's timer is due after this
        delivery's ack deadline (an earlier one stands: it looks again when it fires)."""
        messages, nbytes = room
        if messages <= 0 or nbytes <= 0:
            waiter.set_result(NOTHING)  # out of credit: the stream waits for more
            return _DONE
        entry.max_messages = messages
        entry.max_bytes = nbytes
        if rearm:
            self._rearm(waiter, entry)
        return _PUSHED

    def _rearm(self, waiter: asyncio.Future, entry: PushEntry) -> None:
        """A push receive stays waiting: its timer fires by the next redelivery or ack deadline
        (a delivery, a nack or a take-back may have brought one forward)."""
        due = self._next_timer()
        if due is None:
            return
        due = max(due, 0.001)
        now = time.monotonic()
        if entry.fires_at > now + due + 0.001:
            if entry.timer is not None:
                entry.timer.cancel()
            entry.set_timer(asyncio.get_running_loop().call_later(due, wake, waiter), now + due)

    def _take_now(self, consumer: Consumer, max_messages: int, max_bytes: int) -> Delivery | None | MustAwait:
        """The next delivery for ``consumer`` without an await: a Delivery, None (nothing for it),
        or ``MUST_AWAIT`` (the awaited fetch must decide).  The caller checked that no read holds
        ``read_lock``: the loop serializes the rest."""
        if self.dispatch_limit is not None:
            return MUST_AWAIT
        now = time.monotonic()
        if self.reliable:
            order = self.tracker.order
            if order and order[0].deadline <= now:
                self._expire_due(now)
        return self.dispatcher.fetch_now(consumer, max_messages, max_bytes, now)

    def _count(self, consumer: Consumer, delivery: Delivery) -> None:
        self._turns = turns = self._turns + 1
        consumer.last_turn = turns
        count = delivery.count
        size = len(delivery.frames)
        consumer.messages_out += count
        consumer.bytes_out += size
        counts = self._counts
        if counts is None:
            self.metrics.delivered(self.topic.name, self.name, count, size)
        else:
            counts[0] += count
            counts[1] += size
