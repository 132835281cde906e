"""Subscriptions and their consumers: who is attached, and the receive that waits for them.

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

The subscription's other jobs are its base classes, one module each: push delivery
(``subscription_push.py``), the reads its dispatcher makes (``subscription_reads.py``) and
acks with the failure policy (``subscription_acks.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Callable

from danube._tasks import wake
from danube.broker.cursor import AckTracker
from danube.broker.delivery import MUST_AWAIT, NOTHING, Delivery, cut_frames, frame_offset, split_frames
from danube.broker.dispatch import SUB_TYPES, make_dispatcher
from danube.broker.keyshared import KeyFilter
from danube.broker.policies import DispatchSettings, FailurePolicy
from danube.broker.ratelimit import TokenBucket
from danube.broker.stats import MetricsSink, SubscriptionStats
from danube.broker.subscription_acks import AckHandling
from danube.broker.subscription_push import Push, PushDelivery, PushEntry
from danube.broker.subscription_reads import FreshReads
from danube.errors import NotServedHereError, StreamSupersededError

if TYPE_CHECKING:
    from danube.broker.contracts import Dispatcher
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)

# (Delivery and the frame helpers live in danube.broker.delivery; importable from here too)
__all__ = [
    "Subscription",
    "Consumer",
    "Delivery",
    "Push",
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


class Subscription(PushDelivery, FreshReads, AckHandling):
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
        # the sink's [messages out, bytes out, acked] of this subscription, bumped in place (no
        # call per delivery or ack); None: the sink is called
        self._counts = metrics.subscription_counts(topic.name, name)
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
        # Waiting receives that take deliveries by push (subscription_push.py)
        self._push: dict[asyncio.Future, PushEntry] = {}
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
                entry: PushEntry | None = None
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
                        entry = PushEntry(push, max_messages, max_bytes, epoch)
                        self._push[waiter] = entry
                    await self._wait(waiter, interrupt, loop, token_due, entry)
                    got = waiter.result()
                    if got is not None:
                        return got  # taken by a push the stream could not write (or NOTHING: no credit)
                    if interrupt is not None and interrupt.done():
                        return NOTHING
                    if entry is not None:  # pushes spent some of the credit
                        max_messages, max_bytes = entry.max_messages, entry.max_bytes
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
        entry: PushEntry | None = None,
    ) -> None:
        """Until ``waiter`` is woken (notify), the next redelivery timer or ``token_due`` (seconds)
        is due, or ``interrupt`` is done.  A push receive's ``entry`` holds the timer (a push
        delivery may bring it forward)."""
        timeout = self._next_timer()
        if token_due is not None:
            timeout = token_due if timeout is None else min(timeout, token_due)
        if timeout is None:
            timer = None
        else:
            timeout = max(timeout, 0.001)
            timer = loop.call_later(timeout, wake, waiter)
        if entry is not None:
            entry.set_timer(timer, time.monotonic() + (timeout or 0.0))

        def on_interrupt(_future) -> None:
            wake(waiter)

        if interrupt is not None:
            interrupt.add_done_callback(on_interrupt)
        try:
            await waiter
        finally:
            if entry is not None:
                timer = entry.timer
            if timer is not None:
                timer.cancel()
            if interrupt is not None:
                interrupt.remove_done_callback(on_interrupt)

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
