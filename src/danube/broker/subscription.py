"""Subscriptions and their consumers: cursor, acks, redelivery and the failure policy.

Dispatch is pull-driven: a consumer's ``receive`` takes the next deliverable
frames for it, reading them from its topic (the same bytes the WAL holds, never
re-encoded).  Waiting receivers are woken when the topic appends, when an ack
opens the window, or when a redelivery timer is due.  A receive whose stream can
write at once (``push``) is not woken for fresh frames the storage has at hand:
``notify`` takes them for it without an await or the read lock (the event loop
serializes it; the lock guards only reads that await) and hands them to the
stream, so a small batch costs no task wake-up and no coroutine chain.

What differs between subscription types — who may join, who may receive, what
a receive takes (exclusive, shared, failover, key_shared) — is the subscription's
dispatcher, one class per type in ``danube.broker.dispatch`` (the ``Dispatcher``
protocol of ``danube.broker.contracts``).

Reliable topics track every delivery until it is acked (see ``cursor.py``);
non-reliable subscriptions deliver at most once and track nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable

from danube import message_codec
from danube._tasks import wake
from danube.broker.cursor import AckTracker, to_ranges
from danube.broker.delivery import MUST_AWAIT, NOTHING, Delivery, MustAwait, cut_frames, frame_offset, split_frames
from danube.broker.dispatch import SUB_TYPES, make_dispatcher
from danube.broker.keyshared import KeyFilter
from danube.broker.policies import DispatchSettings, FailurePolicy
from danube.broker.ratelimit import TokenBucket
from danube.broker.stats import MetricsSink, SubscriptionStats
from danube.errors import NotServedHereError, StreamSupersededError

if TYPE_CHECKING:
    from danube.broker.contracts import Dispatcher
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)

# A push callback: given a delivery, writes it and returns the stream's remaining (messages, bytes)
# credit, or None when it could not write it now.
Push = Callable[[Delivery], "tuple[int, int] | None"]

# Rounds of one push pass: consumers with credit left take another delivery while rounds deliver
# (a backlog larger than one read); beyond, their receives are woken and go on reading.
_PUSH_ROUNDS = 8
_PUSHED = "pushed"
_IDLE = "idle"
_DONE = "done"

# Early acks kept per subscription at most (beyond: not recorded; those messages are delivered again).
_MAX_EARLY_ACKS = 65_536

# (Delivery and the frame helpers live in danube.broker.delivery; importable from here too)
__all__ = [
    "Subscription",
    "Consumer",
    "Delivery",
    "SUB_TYPES",
    "StreamSupersededError",
    "cut_frames",
    "split_frames",
    "frame_offset",
]


class Consumer:
    __slots__ = (
        "id",
        "name",
        "subscription",
        "key_filter",
        "active",
        "receiving",
        "messages_out",
        "bytes_out",
        "closed",
        "epoch",
        "last_turn",
    )

    def __init__(self, consumer_id: int, name: str, subscription: "Subscription", key_filter: KeyFilter) -> None:
        self.id = consumer_id
        self.name = name
        self.subscription = subscription
        self.key_filter = key_filter
        self.active = True  # subscribed and not detached
        self.receiving = 0  # receive() calls in progress
        self.messages_out = 0
        self.bytes_out = 0
        self.closed = False  # dropped by the broker (unload, unsubscribe): health answers CLOSE
        self.epoch = 0  # bumped by each new receive stream; older streams stop
        self.last_turn = 0  # the subscription's turn count when this consumer was last served


class Subscription:
    def __init__(
        self,
        topic: "Topic",
        name: str,
        sub_type: str,
        *,
        cursor: int,
        failure_policy: FailurePolicy,
        settings: DispatchSettings,
        metrics: MetricsSink,
        dead_letter: Callable | None = None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.reliable = topic.reliable
        self.failure_policy = failure_policy
        self.settings = settings
        self.metrics = metrics
        self.tracker = AckTracker(cursor)
        self.next_read = cursor + 1
        # Acks of stored offsets not delivered here yet: a consumer acking what the topic's previous
        # owner delivered (the ack was held through the move and lands before the redelivery).  They
        # are skipped at next_read, or settled when delivered, so they do not hold the cursor back.
        self.early_acks: set[int] = set()
        self.consumers: dict[int, Consumer] = {}
        # who may join, who may receive, what a receive takes (InvalidArgumentError: unknown type)
        self.dispatcher: Dispatcher = make_dispatcher(sub_type, self)
        self.dirty = False  # cursor moved since it was last persisted
        # Receives waiting for something to deliver, with their consumers.
        self._waiters: list[tuple[Consumer, asyncio.Future]] = []
        self._turns = 0  # deliveries made; a consumer's last_turn says when it was last served
        # Waiting receives that take deliveries by push: waiter -> [push, max messages, max bytes,
        # stream epoch, its timer]
        self._push: dict[asyncio.Future, list[Any]] = {}
        self._pushing = False  # a push pass is running (notify must not start another)
        self._renotify = False  # notify was called during the pass
        self.read_lock = asyncio.Lock()  # one storage read (and routing) at a time
        self._dead_letter = dead_letter
        self._reasons: dict[int, str] = {}  # offset -> the reason its last nack gave
        self._blocked_logged = False
        # max_subscription_dispatch_rate (messages/s, 0 = unlimited): a delivery carries at most the
        # tokens available; with none, receives wait for the next one.
        rate = topic.policies.max_subscription_dispatch_rate
        self.dispatch_limit = TokenBucket(rate) if rate > 0 else None

    @property
    def sub_type(self) -> str:
        return self.dispatcher.sub_type

    # ------------------------------------------------------------ consumers

    def active_consumers(self) -> list[Consumer]:
        return [c for c in self.consumers.values() if c.active]

    def check_can_join(self, name: str) -> None:
        """AlreadyExistsError when the subscription type refuses a consumer of this name now."""
        self.dispatcher.check_join(name)

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.id] = consumer
        self.activate(consumer)

    def activate(self, consumer: Consumer) -> None:
        self.dispatcher.check_join(consumer.name)
        consumer.active = True
        self.dispatcher.joined(consumer)
        self.notify()

    def set_key_filter(self, consumer: Consumer, key_filter: KeyFilter) -> None:
        """A consumer subscribed again with other key filters (key_shared)."""
        consumer.key_filter = key_filter
        if consumer.active:
            self.dispatcher.joined(consumer)

    def deactivate(self, consumer: Consumer) -> None:
        """The consumer went away: whatever it held unacked goes to the others."""
        if not consumer.active:
            return
        consumer.active = False
        self.dispatcher.left(consumer)
        if self.reliable:
            for offset in self.tracker.take_back_consumer(consumer.id):
                self.tracker.schedule(offset, 0.0)
        self.notify()

    def restart_stream(self, consumer: Consumer) -> int:
        """A new stream serves the consumer: what the old one delivered unacked is sent again."""
        consumer.epoch += 1
        self.dispatcher.restarted(consumer)
        if self.reliable:
            for offset in self.tracker.take_back_consumer(consumer.id):
                self.tracker.schedule(offset, 0.0)
        self.notify()
        return consumer.epoch

    def remove_consumer(self, consumer: Consumer) -> None:
        self.deactivate(consumer)
        self.consumers.pop(consumer.id, None)

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

    def _push_one(self, consumer: Consumer, waiter: asyncio.Future, entry: list[Any]) -> str:
        """One delivery to a push receive: ``_PUSHED`` (written, it has credit left), ``_IDLE``
        (nothing for it now) or ``_DONE`` (its receive was resolved or woken)."""
        push, max_messages, max_bytes, epoch = entry[0], entry[1], entry[2], entry[3]
        if waiter.done() or consumer.closed or not consumer.active or (epoch is not None and epoch != consumer.epoch):
            wake(waiter)
            return _DONE
        delivery = self._take_now(consumer, max_messages, max_bytes)
        if delivery is None:
            if self.reliable:  # (a nack or a taken-back delivery may be due sooner than its timer)
                self._rearm(waiter, entry)
            return _IDLE
        if delivery is MUST_AWAIT:
            wake(waiter)
            return _DONE
        self._count(consumer, delivery)
        room = push(delivery)
        if room is None:  # not written: the receive returns it and its stream writes it
            waiter.set_result(delivery)
            return _DONE
        if room[0] <= 0 or room[1] <= 0:
            waiter.set_result(NOTHING)  # out of credit: the stream waits for more
            return _DONE
        entry[1], entry[2] = room
        if self.reliable:
            timer = entry[4]
            # (a timer due before this delivery's ack deadline stands: it looks again when it fires)
            if (
                timer is None
                or timer.when() - asyncio.get_running_loop().time() > self.failure_policy.ack_timeout_ms / 1000
            ):
                self._rearm(waiter, entry)
        return _PUSHED

    def _rearm(self, waiter: asyncio.Future, entry: list[Any]) -> None:
        """A push receive stays waiting: its timer fires by the next redelivery or ack deadline
        (a delivery, a nack or a take-back may have brought one forward)."""
        due = self._next_timer()
        if due is None:
            return
        due = max(due, 0.001)
        loop = asyncio.get_running_loop()
        timer = entry[4]
        if timer is None or timer.when() > loop.time() + due + 0.001:
            if timer is not None:
                timer.cancel()
            entry[4] = loop.call_later(due, wake, waiter)

    def _take_now(self, consumer: Consumer, max_messages: int, max_bytes: int) -> Delivery | None | MustAwait:
        """The next delivery for ``consumer`` without an await: a Delivery, None (nothing for it),
        or ``MUST_AWAIT`` (the awaited fetch must decide).  The caller checked that no read holds
        ``read_lock``: the loop serializes the rest."""
        if self.dispatch_limit is not None:
            return MUST_AWAIT
        now = time.monotonic()
        if self.reliable:
            self._expire(now)
        return self.dispatcher.fetch_now(consumer, max_messages, max_bytes, now)

    def _count(self, consumer: Consumer, delivery: Delivery) -> None:
        self._turns += 1
        consumer.last_turn = self._turns
        consumer.messages_out += delivery.count
        size = len(delivery.frames)
        consumer.bytes_out += size
        self.metrics.delivered(self.topic.name, self.name, delivery.count, size)

    # ------------------------------------------------------------ receive

    async def receive(
        self,
        consumer: Consumer,
        max_messages: int,
        max_bytes: int,
        epoch: int | None = None,
        interrupt: asyncio.Future | None = None,
        push: Push | None = None,
    ) -> Delivery:
        """The next delivery for ``consumer``, waiting until there is one.

        With ``interrupt``: once that future is done while the receive waits (never after
        it took messages), an empty delivery (``count`` 0) is returned, so a stream can
        attend to other work without a second task waiting beside the receive.

        With ``push``: while the receive waits, deliveries are handed to ``push(delivery)``
        as they become available (see :meth:`notify`), without waking the receive's task.
        ``push`` returns the stream's remaining ``(messages, bytes)`` credit once it wrote the
        delivery, or None when it could not write it now: the receive then returns it.  Out
        of credit, the receive returns an empty delivery."""
        max_messages = max(1, int(max_messages))
        max_bytes = max(1, int(max_bytes))
        loop = asyncio.get_running_loop()
        consumer.receiving += 1
        try:
            while True:
                if consumer.closed:
                    raise NotServedHereError(
                        f"consumer {consumer.id} was closed: topic {self.topic.name} is no longer served here"
                    )
                if epoch is not None and epoch != consumer.epoch:
                    raise StreamSupersededError(f"consumer {consumer.id} is served by a newer stream")
                if not consumer.active:
                    self.activate(consumer)
                # Registered before the fetch: a notify while the fetch awaits storage is not lost.
                waiter = loop.create_future()
                self._waiters.append((consumer, waiter))
                token_due = None  # throttled by the dispatch rate: when the next token is due
                entry: list[Any] | None = None
                try:
                    limit = self.dispatch_limit
                    if limit is None:
                        delivery = (
                            MUST_AWAIT if self.read_lock.locked() else self._take_now(consumer, max_messages, max_bytes)
                        )
                        if delivery is MUST_AWAIT:
                            delivery = await self._fetch(consumer, max_messages, max_bytes)
                    else:
                        allowed = limit.available()
                        if allowed:
                            delivery = await self._fetch(consumer, min(max_messages, allowed), max_bytes)
                            if delivery is not None:
                                limit.take(delivery.count)
                        else:
                            delivery = None
                            # wait for 10 ms worth of tokens, not one: fewer, larger deliveries
                            token_due = limit.wait_time(min(max_messages, max(1, int(limit.rate / 100))))
                    if delivery is not None:
                        self._count(consumer, delivery)
                        return delivery
                    if interrupt is not None and interrupt.done():
                        return NOTHING
                    if push is not None and limit is None:
                        entry = [push, max_messages, max_bytes, epoch, None]
                        self._push[waiter] = entry
                    await self._wait(waiter, interrupt, loop, token_due, entry)
                    got = waiter.result()
                    if got is not None:
                        return got  # taken by a push the stream could not write (or NOTHING: no credit)
                    if interrupt is not None and interrupt.done():
                        return NOTHING
                    if entry is not None:  # pushes spent some of the credit
                        max_messages, max_bytes = entry[1], entry[2]
                finally:
                    if entry is not None:
                        del self._push[waiter]
                    if not waiter.done():
                        waiter.cancel()
                    waiters = self._waiters  # (notify empties it; a timer or an interrupt does not)
                    if waiters and waiters[-1][1] is waiter:
                        waiters.pop()
                    elif waiters:
                        with contextlib.suppress(ValueError):
                            waiters.remove((consumer, waiter))
        finally:
            consumer.receiving -= 1

    async def _wait(
        self,
        waiter: asyncio.Future,
        interrupt: asyncio.Future | None,
        loop: asyncio.AbstractEventLoop,
        token_due: float | None = None,
        entry: list[Any] | None = None,
    ) -> None:
        """Until ``waiter`` is woken (notify), the next redelivery timer or ``token_due`` (seconds)
        is due, or ``interrupt`` is done.  A push receive's ``entry`` holds the timer (a push
        delivery may bring it forward)."""
        timeout = self._next_timer()
        if token_due is not None:
            timeout = token_due if timeout is None else min(timeout, token_due)
        timer = None if timeout is None else loop.call_later(max(timeout, 0.001), wake, waiter)
        if entry is not None:
            entry[4] = timer

        def on_interrupt(_future) -> None:
            wake(waiter)

        if interrupt is not None:
            interrupt.add_done_callback(on_interrupt)
        try:
            await waiter
        finally:
            if entry is not None:
                timer = entry[4]
            if timer is not None:
                timer.cancel()
            if interrupt is not None:
                interrupt.remove_done_callback(on_interrupt)

    def _next_timer(self) -> float | None:
        if not self.reliable:
            return None
        now = time.monotonic()
        times = [t for t in (self.tracker.next_ready(), self.tracker.next_deadline()) if t is not None]
        return (min(times) - now) if times else None

    async def _fetch(self, consumer: Consumer, max_messages: int, max_bytes: int) -> Delivery | None:
        dispatcher = self.dispatcher
        if not dispatcher.may_receive(consumer):
            return None
        now = time.monotonic()
        if self.reliable:
            self._expire(now)
        return await dispatcher.fetch(consumer, max_messages, max_bytes, now)

    # ------------------------------------------------------------ what dispatchers read with

    def window(self) -> int:
        """How many more messages may go out now: the room under max_unacked_messages, 0 while
        poison messages block the subscription."""
        if not self.reliable:
            return 1 << 62
        if self._report_block() and not self.dispatcher.blocks_per_key:
            return 0
        return self.settings.max_unacked_messages - self.tracker.unacked

    def _report_block(self) -> bool:
        """Whether poison messages block the subscription (poison policy block); logs each block
        once, when it is first seen."""
        if not self.tracker.blocked:
            self._blocked_logged = False
            return False
        if not self._blocked_logged:
            log.error(
                "subscription %s on %s is blocked by poison message(s) %s (poison policy block)",
                self.name,
                self.topic.name,
                sorted(self.tracker.blocked)[:5],
            )
            self._blocked_logged = True
        return True

    def _visible(self) -> int:
        """How many fresh messages from next_read subscribers may see now (skipping early acks and
        what the topic no longer holds first)."""
        topic = self.topic
        if self.early_acks:
            self._skip_early()
        first_held = topic.first_offset
        if self.next_read < first_held:
            lost = first_held - self.next_read
            log.warning(
                "subscription %s on %s skips %d messages no longer held (offsets %d..%d)",
                self.name,
                topic.name,
                lost,
                self.next_read,
                first_held - 1,
            )
            self.metrics.dropped(topic.name, self.name, lost, "evicted")
            if self.reliable:
                self.tracker.cursor = max(self.tracker.cursor, first_held - 1)
                self.dirty = True
            self.next_read = first_held
        readable = topic.readable_next
        if topic.delivery_gate is not None:  # a repartition holds moved keys (danube.routing.repartition.gate)
            readable = topic.delivery_gate.readable(self, readable)
        return readable - self.next_read

    async def read_fresh(self, max_messages: int, max_bytes: int) -> tuple[memoryview, int] | tuple[None, int]:
        """Fresh frames from next_read: (view, count) or (None, 0); next_read is left to the caller."""
        visible = self._visible()
        if visible <= 0:
            return None, 0
        data = await self.topic.read_frames(self.next_read, max_bytes)
        return self._cut_fresh(data, min(max_messages, visible), max_bytes)

    def read_fresh_now(
        self, max_messages: int, max_bytes: int
    ) -> tuple[memoryview, int] | tuple[None, int] | MustAwait:
        """:meth:`read_fresh` without an await: ``MUST_AWAIT`` when the storage cannot answer at
        once (history on disk, a sealed storage); the caller then takes the awaited path."""
        visible = self._visible()
        if visible <= 0:
            return None, 0
        read_now = getattr(self.topic.storage, "read_frames_now", None)
        data = None if read_now is None else read_now(self.next_read, max_bytes)
        if data is None:
            return MUST_AWAIT
        return self._cut_fresh(data, min(max_messages, visible), max_bytes)

    def _cut_fresh(self, data, max_messages: int, max_bytes: int) -> tuple[memoryview, int] | tuple[None, int]:
        if not data:
            return None, 0
        view, count = cut_frames(data, max_messages, max_bytes)
        if count == 0:
            return None, 0
        first = frame_offset(view)
        if first != self.next_read:
            raise RuntimeError(f"storage of {self.topic.name} returned offset {first} for {self.next_read}")
        # Records stored before publish checked them (or by a broker that did not) may hold a
        # routing key or attribute no subscriber can decode: deliver up to such a record and
        # hand it to the failure policy, so the subscription never stalls on it.
        bad, problem = message_codec.check_fields(view)
        if bad > 0:
            view = view[:bad]
            count = len(message_codec.frame_positions(view))
        elif bad == 0:
            self.reject_fresh(message_codec.FIELDS_PROBLEMS.get(problem, "it is malformed"))
            return None, 0
        return view, count

    def reject_fresh(self, problem: str) -> None:
        """The record at ``next_read`` cannot be delivered: it goes to the failure policy at once
        (dead letter, drop or block) without reaching a consumer."""
        offset = self.next_read
        self.next_read = offset + 1
        self.reject(offset, problem)

    def reject(self, offset: int, problem: str) -> None:
        """``offset`` cannot be delivered (``problem`` says why): no redelivery would help, so the
        poison policy applies now.  Under ``block`` the subscription holds there until an admin skip."""
        log.error(
            "message %d of %s cannot be delivered on subscription %s: %s; poison policy %s",
            offset,
            self.topic.name,
            self.name,
            problem,
            self.failure_policy.poison_policy if self.reliable else "drop (non-reliable)",
        )
        if not self.reliable:
            self.metrics.dropped(self.topic.name, self.name, 1, "undeliverable")
            self.tracker.cursor = max(self.tracker.cursor, offset)
        else:
            self.tracker.take_back(offset)
            self.tracker.attempts.pop(offset, None)
            self._poison(offset, problem)
        self.notify()  # the receive that met it reads on (or sees the block)

    async def deliver_fresh(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        """Fresh frames from next_read for ``consumer`` (within the unacked window), tracked as
        delivered to it; None when there are none."""
        window = self.window()
        if window <= 0:
            return None
        view, count = await self.read_fresh(min(max_messages, window), max_bytes)
        if view is None:
            return None
        return self._track_fresh(consumer, view, count, now)

    def deliver_fresh_now(
        self, consumer: Consumer, max_messages: int, max_bytes: int, now: float
    ) -> Delivery | None | MustAwait:
        """:meth:`deliver_fresh` without an await: a Delivery, None, or ``MUST_AWAIT`` when the
        storage cannot answer at once."""
        window = self.window()
        if window <= 0:
            return None
        read = self.read_fresh_now(min(max_messages, window), max_bytes)
        if read is MUST_AWAIT:
            return MUST_AWAIT
        view, count = read
        if view is None:
            return None
        return self._track_fresh(consumer, view, count, now)

    def _track_fresh(self, consumer: Consumer, view: memoryview, count: int, now: float) -> Delivery:
        first = self.next_read
        last = first + count - 1
        self.next_read = last + 1
        if self.reliable:
            self.tracker.delivered(first, last, consumer.id, now + self.failure_policy.ack_timeout_ms / 1000)
            if self.early_acks:
                self._settle_early(first, last)
        else:
            self.tracker.cursor = last
        return Delivery(view, first, last, count)

    async def frame_at(self, offset: int) -> memoryview | None:
        """The stored frame of ``offset`` (a redelivery), None when it is no longer held."""
        data = await self.topic.read_frames(offset, 1)
        if not data:
            return None
        view, count = cut_frames(data, 1, 1)
        if count != 1 or frame_offset(view) != offset:
            return None
        return view

    async def redeliver(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        """Messages due for redelivery, to ``consumer``; None when none could be read."""
        offsets = self.tracker.pop_ready(now, max_messages)
        if not offsets:
            return None
        parts: list[memoryview] = []
        counts: dict[int, int] = {}
        size = 0
        for i, offset in enumerate(offsets):
            view = await self.frame_at(offset)
            if view is None:
                log.warning("message %d of %s is no longer stored; cannot redeliver it", offset, self.topic.name)
                continue
            if parts and size + len(view) > max_bytes:
                self.tracker.push_back(offsets[i:])
                break
            parts.append(view)
            size += len(view)
            counts[offset] = self.tracker.attempts.get(offset, 0)
        if not parts:
            if self.tracker.advance(self.next_read):
                self.dirty = True
            return None
        deadline = now + self.failure_policy.ack_timeout_ms / 1000
        delivered = sorted(counts)
        for lo, hi in to_ranges(delivered):
            self.tracker.delivered(lo, hi, consumer.id, deadline)
        self.metrics.redelivered(self.topic.name, self.name, len(parts))
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return Delivery(buf, min(counts), max(counts), len(parts), counts)

    # ------------------------------------------------------------ acks and failures

    def _check_served(self) -> None:
        # Once the topic is closed (unload, shutdown) its cursors are being persisted for the
        # last time: an ack answered OK now would move a cursor that is never saved.
        if self.topic.closed:
            raise NotServedHereError(
                f"topic {self.topic.name} is no longer served here; the ack was not applied, look it up again"
            )

    def ack(self, offsets: Iterable[int]) -> int:
        return self.ack_ranges(to_ranges(offsets))

    def ack_ranges(self, ranges: list[tuple[int, int]]) -> int:
        """Ack inclusive ``(first, last)`` ranges (any order, overlaps allowed): no work per offset."""
        if not self.reliable:
            return 0
        self._check_served()
        self._expire(time.monotonic())
        tracker = self.tracker
        was_full = tracker.unacked >= self.settings.max_unacked_messages
        n = tracker.ack_ranges(ranges)
        n += self._note_early(ranges)
        if self._reasons:
            for lo, hi in ranges:
                for o in [o for o in self._reasons if lo <= o <= hi]:
                    del self._reasons[o]
        if n:
            self.metrics.acked(self.topic.name, self.name, n)
            if tracker.advance(self.next_read):
                self.dirty = True
            # Receivers wait on an ack only when the unacked window was full, or when the
            # dispatcher holds messages back until earlier ones are acked (key_shared): a wake
            # for every ack would cost each consumer's stream a futile fetch per ack otherwise.
            if was_full or self.dispatcher.acks_release:
                self.notify()
        return n

    def _note_early(self, ranges: list[tuple[int, int]]) -> int:
        """Record acks of stored offsets at or after next_read (see ``early_acks``); the next read
        skips them (not here: a read may be awaiting storage from next_read).  Returns how many."""
        end = self.topic.readable_next
        early = self.early_acks
        noted = 0
        for lo, hi in ranges:
            lo, hi = max(lo, self.next_read), min(hi, end - 1)
            if lo <= hi and len(early) + hi - lo < _MAX_EARLY_ACKS:
                before = len(early)
                early.update(range(lo, hi + 1))
                noted += len(early) - before
        return noted

    def _skip_early(self) -> int:
        early = self.early_acks
        skipped = 0
        while self.next_read in early:
            early.discard(self.next_read)
            self.next_read += 1
            skipped += 1
        if skipped and self.tracker.advance(self.next_read):
            self.dirty = True
        return skipped

    def _settle_early(self, first: int, last: int) -> None:
        """Early acks inside a run just delivered: acked now (the consumer has them already)."""
        hits = [o for o in self.early_acks if first <= o <= last]
        if hits:
            self.early_acks.difference_update(hits)
            self.tracker.ack_ranges(to_ranges(hits))

    def nack(self, offset: int, delay_ms: int | None = None, reason: str | None = None) -> bool:
        if not self.reliable:
            return False
        self._check_served()
        if self.tracker.take_back(offset) is None:
            return False
        self.dispatcher.forget((offset,))
        if reason:
            log.info("message %d of %s nacked on %s: %s", offset, self.topic.name, self.name, reason)
            self._reasons[offset] = reason
        else:
            self._reasons.pop(offset, None)  # as Danube: the last failure's reason, or none
        self._retry(offset, time.monotonic(), requested_ms=delay_ms, nack=True)
        self.notify()
        return True

    def _retry(self, offset: int, now: float, *, requested_ms: int | None = None, nack: bool = False) -> None:
        attempt = self.tracker.attempts.get(offset, 0) + 1
        policy = self.failure_policy
        if attempt > policy.max_redelivery_count:  # Danube's rule: 0 = never delivered again
            self._poison(offset, attempt=attempt)
            return
        self.tracker.attempts[offset] = attempt
        delay = policy.nack_delay_ms(attempt, requested_ms) if nack else policy.backoff_ms(attempt)
        self.tracker.schedule(offset, now + delay / 1000)

    def _poison(self, offset: int, problem: str | None = None, attempt: int | None = None) -> None:
        """Apply the poison policy to ``offset``; ``attempt`` is how many deliveries it had."""
        policy = self.failure_policy.poison_policy
        self.metrics.dropped(self.topic.name, self.name, 1, policy)
        reason = problem if problem is not None else self._reasons.pop(offset, None)
        if policy == "block":
            self.tracker.blocked.add(offset)
            self.dispatcher.blocked(offset)
            return
        self.tracker.attempts.pop(offset, None)
        if policy == "dead_letter" and self._dead_letter is not None:
            self._dead_letter(self, offset, attempt=attempt or 1, reason=reason)
        elif problem is not None:
            log.warning(
                "message %d of %s dropped on %s: %s (poison policy drop)", offset, self.topic.name, self.name, problem
            )
        else:
            log.warning(
                "message %d of %s dropped on %s after %d redeliveries (poison policy drop)",
                offset,
                self.topic.name,
                self.name,
                self.failure_policy.max_redelivery_count,
            )
        if self.tracker.advance(self.next_read):
            self.dirty = True

    def _expire(self, now: float) -> None:
        deadline = self.tracker.next_deadline()
        if deadline is None or deadline > now:
            return
        offsets = self.tracker.expired(now)
        if offsets:
            self.dispatcher.forget(set(offsets))
            for offset in offsets:
                self._retry(offset, now)

    def unblock(self) -> int:
        """Release poison messages held under the block policy (admin 'skip'); they count as acked."""
        held = sorted(self.tracker.blocked)
        self.tracker.blocked.clear()
        if self.tracker.advance(self.next_read):
            self.dirty = True
        self.notify()
        return len(held)

    # ------------------------------------------------------------ stats

    @property
    def cursor(self) -> int:
        return self.tracker.cursor

    def stats(self) -> SubscriptionStats:
        return SubscriptionStats(
            name=self.name,
            sub_type=self.sub_type,
            consumers=len(self.active_consumers()),
            cursor=self.tracker.cursor,
            unacked=self.tracker.unacked,
            backlog=max(0, self.topic.readable_next - 1 - self.tracker.cursor),
        )
