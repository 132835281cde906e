"""Subscriptions, their consumers, and dispatch (exclusive, shared, failover, key_shared).

Dispatch is pull-driven: a consumer's ``receive`` takes the next deliverable
frames for it, reading them from the topic's storage (the same bytes the WAL
holds, never re-encoded).  Waiting receivers are woken when the topic appends,
when an ack opens the window, or when a redelivery timer is due.

- exclusive: one consumer; a second one (another name) is rejected.
- failover: the first connected consumer receives; the next takes over (with
  everything its predecessor left unacked) when it goes.
- shared: whichever consumer asks next gets the next batch; receivers queue in
  arrival order, so consumers take turns (round robin).
- key_shared: each message goes to the consumer the hash ring picks for its key
  (routing key, else producer name) among consumers whose glob filters accept it.

Reliable topics track every delivery until it is acked (see ``cursor.py``);
non-reliable subscriptions deliver at most once and track nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from danube import frames
from danube._tasks import wake
from danube.broker.cursor import AckTracker, to_ranges
from danube.broker.keyshared import HashRing, KeyFilter
from danube.broker.policies import DispatchSettings, FailurePolicy
from danube.broker.ratelimit import TokenBucket
from danube.broker.stats import MetricsSink, SubscriptionStats
from danube.errors import AlreadyExistsError, InvalidArgumentError, NotServedHereError, StreamSupersededError

if TYPE_CHECKING:
    from danube.broker.topic import Topic

log = logging.getLogger(__name__)

SUB_TYPES = ("exclusive", "shared", "failover", "key_shared")
_HEADER = frames.HEADER_SIZE


@dataclass
class Delivery:
    """Frames handed to one consumer: whole frames, offsets stamped.

    ``redelivery_counts`` maps offset -> times redelivered, only for redelivered
    messages.  Offsets are consecutive unless the subscription is key_shared or
    the delivery holds redeliveries.
    """

    frames: memoryview | bytes
    first_offset: int
    last_offset: int
    count: int
    redelivery_counts: dict[int, int] = field(default_factory=dict)


_NOTHING = Delivery(b"", -1, -1, 0)   # an interrupted receive


def cut_frames(buf, max_messages: int, max_bytes: int) -> tuple[memoryview, int]:
    """The longest prefix of whole frames within both limits (always at least one frame).

    The frame walk is one codec call (``frames.frame_positions``, compiled), so a
    delivery costs no Python work per message."""
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    n = len(view)
    if n < _HEADER:
        return view[:0], 0
    positions = frames.frame_positions(view)
    count = min(len(positions), max_messages)
    if count == 0:
        return view[:0], 0
    end = positions[count] if count < len(positions) else n
    if end > max_bytes and count > 1:
        # positions[k] is where the first k frames end: keep the most that end within max_bytes
        count = max(1, bisect.bisect_right(positions, max_bytes, 1, count) - 1)
        end = positions[count]
    return view[:end], count


def split_frames(buf) -> list[memoryview]:
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
    positions = frames.frame_positions(view)
    out = []
    for i, p in enumerate(positions):
        end = positions[i + 1] if i + 1 < len(positions) else len(view)
        out.append(view[p:end])
    return out


def frame_offset(view) -> int:
    return int.from_bytes(view[0:8], "little")


class Consumer:
    __slots__ = ("id", "name", "subscription", "key_filter", "active", "receiving",
                 "messages_out", "bytes_out", "queue", "closed", "epoch", "last_turn")

    def __init__(self, consumer_id: int, name: str, subscription: "Subscription",
                 key_filter: KeyFilter) -> None:
        self.id = consumer_id
        self.name = name
        self.subscription = subscription
        self.key_filter = key_filter
        self.active = True  # subscribed and not detached
        self.receiving = 0  # receive() calls in progress
        self.messages_out = 0
        self.bytes_out = 0
        self.queue: deque[memoryview] = deque()  # key_shared: frames routed here, not yet delivered
        self.closed = False  # dropped by the broker (unload, unsubscribe): health answers CLOSE
        self.epoch = 0  # bumped by each new receive stream; older streams stop
        self.last_turn = 0  # the subscription's turn count when this consumer was last served


def _last_turn(waiting: tuple["Consumer", asyncio.Future]) -> int:
    return waiting[0].last_turn


class Subscription:
    def __init__(self, topic: "Topic", name: str, sub_type: str, *, cursor: int,
                 failure_policy: FailurePolicy, settings: DispatchSettings,
                 metrics: MetricsSink, dead_letter: Callable | None = None) -> None:
        if sub_type not in SUB_TYPES:
            raise InvalidArgumentError(f"unknown subscription type {sub_type!r}; expected one of {', '.join(SUB_TYPES)}")
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.reliable = topic.reliable
        self.failure_policy = failure_policy
        self.settings = settings
        self.metrics = metrics
        self.tracker = AckTracker(cursor)
        self.next_read = cursor + 1
        self.consumers: dict[int, Consumer] = {}
        self.ring = HashRing() if sub_type == "key_shared" else None
        self.dirty = False  # cursor moved since it was last persisted
        # Receives waiting for something to deliver, with their consumers.
        self._waiters: list[tuple[Consumer, asyncio.Future]] = []
        self._turns = 0  # deliveries made; a consumer's last_turn says when it was last served
        self._read_lock = asyncio.Lock()
        self._dead_letter = dead_letter
        self._blocked_logged = False
        # max_subscription_dispatch_rate (messages/s, 0 = unlimited): a delivery carries at most the
        # tokens available; with none, receives wait for the next one.
        rate = topic.policies.max_subscription_dispatch_rate
        self.dispatch_limit = TokenBucket(rate) if rate > 0 else None

    # ------------------------------------------------------------ consumers

    def active_consumers(self) -> list[Consumer]:
        return [c for c in self.consumers.values() if c.active]

    def check_can_join(self, name: str) -> None:
        if self.sub_type == "exclusive":
            others = [c for c in self.active_consumers() if c.name != name]
            if others:
                raise AlreadyExistsError(
                    f"subscription '{self.name}' on topic {self.topic.name} is exclusive and already has "
                    f"consumer '{others[0].name}'; use another subscription name or a shared/failover subscription")

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers[consumer.id] = consumer
        self.activate(consumer)

    def activate(self, consumer: Consumer) -> None:
        if consumer.active and self.ring is not None and consumer.id in self.ring.consumers():
            return
        self.check_can_join(consumer.name)
        consumer.active = True
        if self.ring is not None:
            self.ring.add(consumer.id, consumer.key_filter)
        self.notify()

    def deactivate(self, consumer: Consumer) -> None:
        """The consumer went away: whatever it held unacked goes to the others."""
        if not consumer.active:
            return
        consumer.active = False
        if self.ring is not None:
            self.ring.remove(consumer.id)
        consumer.queue.clear()
        if self.reliable:
            for offset in self.tracker.take_back_consumer(consumer.id):
                self.tracker.schedule(offset, 0.0)
        self.notify()

    def restart_stream(self, consumer: Consumer) -> int:
        """A new stream serves the consumer: what the old one delivered unacked is sent again."""
        consumer.epoch += 1
        consumer.queue.clear()
        if self.reliable:
            for offset in self.tracker.take_back_consumer(consumer.id):
                self.tracker.schedule(offset, 0.0)
        self.notify()
        return consumer.epoch

    def remove_consumer(self, consumer: Consumer) -> None:
        self.deactivate(consumer)
        self.consumers.pop(consumer.id, None)

    def notify(self) -> None:
        """Something may be deliverable now: wake every waiting receive."""
        waiters = self._waiters
        if waiters:
            self._waiters = []
            if len(waiters) > 1 and self.sub_type == "shared":
                # Woken consumers fetch in wake order: the least recently served goes first, so
                # shared consumers take turns however quickly each one comes back for more.
                waiters.sort(key=_last_turn)
            for _, waiter in waiters:
                wake(waiter)

    # ------------------------------------------------------------ receive

    async def receive(self, consumer: Consumer, max_messages: int, max_bytes: int,
                      epoch: int | None = None, interrupt: asyncio.Future | None = None) -> Delivery:
        """The next delivery for ``consumer``, waiting until there is one.

        With ``interrupt``: once that future is done while the receive waits (never after
        it took messages), an empty delivery (``count`` 0) is returned, so a stream can
        attend to other work without a second task waiting beside the receive."""
        max_messages = max(1, int(max_messages))
        max_bytes = max(1, int(max_bytes))
        loop = asyncio.get_running_loop()
        consumer.receiving += 1
        try:
            while True:
                if consumer.closed:
                    raise NotServedHereError(
                        f"consumer {consumer.id} was closed: topic {self.topic.name} is no longer served here")
                if epoch is not None and epoch != consumer.epoch:
                    raise StreamSupersededError(f"consumer {consumer.id} is served by a newer stream")
                if not consumer.active:
                    self.activate(consumer)
                # Registered before the fetch: a notify while the fetch awaits storage is not lost.
                waiter = loop.create_future()
                self._waiters.append((consumer, waiter))
                token_due = None   # throttled by the dispatch rate: when the next token is due
                try:
                    limit = self.dispatch_limit
                    if limit is None:
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
                        self._turns += 1
                        consumer.last_turn = self._turns
                        consumer.messages_out += delivery.count
                        consumer.bytes_out += len(delivery.frames)
                        self.metrics.delivered(self.topic.name, self.name, delivery.count, len(delivery.frames))
                        return delivery
                    if interrupt is not None and interrupt.done():
                        return _NOTHING
                    await self._wait(waiter, interrupt, loop, token_due)
                    if interrupt is not None and interrupt.done():
                        return _NOTHING
                finally:
                    if not waiter.done():
                        waiter.cancel()
                    waiters = self._waiters   # (notify empties it; a timer or an interrupt does not)
                    if waiters and waiters[-1][1] is waiter:
                        waiters.pop()
                    elif waiters:
                        with contextlib.suppress(ValueError):
                            waiters.remove((consumer, waiter))
        finally:
            consumer.receiving -= 1

    async def _wait(self, waiter: asyncio.Future, interrupt: asyncio.Future | None,
                    loop: asyncio.AbstractEventLoop, token_due: float | None = None) -> None:
        """Until ``waiter`` is woken (notify), the next redelivery timer or ``token_due`` (seconds)
        is due, or ``interrupt`` is done."""
        timeout = self._next_timer()
        if token_due is not None:
            timeout = token_due if timeout is None else min(timeout, token_due)
        timer = None if timeout is None else loop.call_later(max(timeout, 0.001), wake, waiter)

        def on_interrupt(_future) -> None:
            wake(waiter)

        if interrupt is not None:
            interrupt.add_done_callback(on_interrupt)
        try:
            await waiter
        finally:
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

    def _may_receive(self, consumer: Consumer) -> bool:
        if self.sub_type == "failover":
            for c in self.consumers.values():
                if c.active:
                    return c is consumer
            return False
        return True

    async def _fetch(self, consumer: Consumer, max_messages: int, max_bytes: int) -> Delivery | None:
        if not self._may_receive(consumer):
            return None
        now = time.monotonic()
        if self.reliable:
            self._expire(now)
        if self.sub_type == "key_shared":
            return await self._fetch_key_shared(consumer, max_messages, max_bytes, now)
        async with self._read_lock:
            if self.reliable and self.tracker.has_ready(now):
                delivery = await self._redeliver(consumer, max_messages, max_bytes, now)
                if delivery is not None:
                    return delivery
            return await self._fresh(consumer, max_messages, max_bytes, now)

    def _window(self) -> int:
        """How many more messages may go out now: the room under max_unacked_messages, 0 while
        poison messages block the subscription."""
        if not self.reliable:
            return 1 << 62
        if self._report_block():
            return 0
        return self.settings.max_unacked_messages - self.tracker.unacked

    def _report_block(self) -> bool:
        """Whether poison messages block the subscription (poison policy block); logs each block
        once, when it is first seen."""
        if not self.tracker.blocked:
            self._blocked_logged = False
            return False
        if not self._blocked_logged:
            log.error("subscription %s on %s is blocked by poison message(s) %s (poison policy block)",
                      self.name, self.topic.name, sorted(self.tracker.blocked)[:5])
            self._blocked_logged = True
        return True

    async def _read(self, max_messages: int, max_bytes: int):
        """Fresh frames from next_read: (view, count) or (None, 0)."""
        storage = self.topic.storage
        if self.next_read < storage.first_offset:
            lost = storage.first_offset - self.next_read
            log.warning("subscription %s on %s skips %d messages no longer held (offsets %d..%d)",
                        self.name, self.topic.name, lost, self.next_read, storage.first_offset - 1)
            self.metrics.dropped(self.topic.name, self.name, lost, "evicted")
            if self.reliable:
                self.tracker.cursor = max(self.tracker.cursor, storage.first_offset - 1)
                self.dirty = True
            self.next_read = storage.first_offset
        visible = self.topic.readable_next - self.next_read
        if visible <= 0:
            return None, 0
        max_messages = min(max_messages, visible)
        data = await storage.read_frames(self.next_read, max_bytes)
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
        bad, problem = frames.check_fields(view)
        if bad > 0:
            view = view[:bad]
            count = len(frames.frame_positions(view))
        elif bad == 0:
            self.reject_fresh(frames.FIELDS_PROBLEMS.get(problem, "it is malformed"))
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
        log.error("message %d of %s cannot be delivered on subscription %s: %s; poison policy %s",
                  offset, self.topic.name, self.name, problem,
                  self.failure_policy.poison_policy if self.reliable else "drop (non-reliable)")
        if not self.reliable:
            self.metrics.dropped(self.topic.name, self.name, 1, "undeliverable")
            self.tracker.cursor = max(self.tracker.cursor, offset)
        else:
            self.tracker.take_back(offset)
            self.tracker.attempts.pop(offset, None)
            self._poison(offset, problem)
        self.notify()  # the receive that met it reads on (or sees the block)

    async def _fresh(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        window = self._window()
        if window <= 0:
            return None
        if self.sub_type == "shared":
            # Split what is available among the consumers waiting now, so they take turns.
            waiting = sum(1 for c in self.consumers.values() if c.active and c.receiving)
            if waiting > 1:
                available = self.topic.readable_next - self.next_read
                max_messages = min(max_messages, max(1, -(-available // waiting)))
        view, count = await self._read(min(max_messages, window), max_bytes)
        if view is None:
            return None
        first = self.next_read
        last = first + count - 1
        self.next_read = last + 1
        if self.reliable:
            self.tracker.delivered(first, last, consumer.id, now + self.failure_policy.ack_timeout_ms / 1000)
        else:
            self.tracker.cursor = last
        return Delivery(view, first, last, count)

    async def _frame_at(self, offset: int) -> memoryview | None:
        data = await self.topic.storage.read_frames(offset, 1)
        if not data:
            return None
        view, count = cut_frames(data, 1, 1)
        if count != 1 or frame_offset(view) != offset:
            return None
        return view

    async def _redeliver(self, consumer: Consumer, max_messages: int, max_bytes: int,
                         now: float) -> Delivery | None:
        offsets = self.tracker.pop_ready(now, max_messages)
        if not offsets:
            return None
        parts: list[memoryview] = []
        counts: dict[int, int] = {}
        size = 0
        for i, offset in enumerate(offsets):
            view = await self._frame_at(offset)
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
            self.tracker.advance(self.next_read) and self._mark_dirty()
            return None
        deadline = now + self.failure_policy.ack_timeout_ms / 1000
        delivered = sorted(counts)
        for lo, hi in to_ranges(delivered):
            self.tracker.delivered(lo, hi, consumer.id, deadline)
        self.metrics.redelivered(self.topic.name, self.name, len(parts))
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return Delivery(buf, min(counts), max(counts), len(parts), counts)

    # ------------------------------------------------------------ key_shared

    def _route_key(self, view: memoryview) -> str:
        rec, _ = frames.decode_frame(view, 0)
        if rec.routing_key is not None:
            return rec.routing_key
        return self.topic.producer_name(rec.producer_id)

    def _route(self, parts: list[memoryview], now: float) -> None:
        deadline = now + self.failure_policy.ack_timeout_ms / 1000
        for view in parts:
            offset = frame_offset(view)
            owner_id = self.ring.owner(self._route_key(view))
            owner = self.consumers.get(owner_id) if owner_id is not None else None
            if owner is None:
                # No consumer accepts this key now; try again shortly (never dropped).
                if self.reliable:
                    self.tracker.schedule(offset, now + 1.0)
                continue
            owner.queue.append(view)
            if self.reliable:
                self.tracker.delivered(offset, offset, owner.id, deadline)

    async def _fetch_key_shared(self, consumer: Consumer, max_messages: int, max_bytes: int,
                                now: float) -> Delivery | None:
        if not consumer.queue:
            async with self._read_lock:
                if self.reliable and self.tracker.has_ready(now):
                    offsets = self.tracker.pop_ready(now, self.settings.max_batch_messages)
                    parts = [v for v in [await self._frame_at(o) for o in offsets] if v is not None]
                    self._route(parts, now)
                if not consumer.queue:
                    window = self._window()
                    if window > 0:
                        view, count = await self._read(min(window, self.settings.max_batch_messages),
                                                       self.settings.max_batch_bytes)
                        if view is not None:
                            self.next_read += count
                            self._route(split_frames(view), now)
                            if not self.reliable:
                                self.tracker.cursor = self.next_read - 1
                            self.notify()
        if not consumer.queue:
            return None
        parts: list[memoryview] = []
        size = 0
        while consumer.queue and len(parts) < max_messages:
            view = consumer.queue[0]
            if parts and size + len(view) > max_bytes:
                break
            consumer.queue.popleft()
            parts.append(view)
            size += len(view)
        offsets = [frame_offset(v) for v in parts]
        counts = {o: self.tracker.attempts[o] for o in offsets if o in self.tracker.attempts}
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return Delivery(buf, min(offsets), max(offsets), len(parts), counts)

    # ------------------------------------------------------------ acks and failures

    def _mark_dirty(self) -> None:
        self.dirty = True

    def _check_served(self) -> None:
        # Once the topic is closed (unload, shutdown) its cursors are being persisted for the
        # last time: an ack answered OK now would move a cursor that is never saved.
        if self.topic.closed:
            raise NotServedHereError(
                f"topic {self.topic.name} is no longer served here; the ack was not applied, look it up again")

    def ack(self, offsets) -> int:
        return self.ack_ranges(to_ranges(offsets))

    def ack_ranges(self, ranges) -> int:
        """Ack inclusive ``(first, last)`` ranges (any order, overlaps allowed): no work per offset."""
        if not self.reliable:
            return 0
        self._check_served()
        self._expire(time.monotonic())
        n = self.tracker.ack_ranges(ranges)
        if n:
            self.metrics.acked(self.topic.name, self.name, n)
            if self.tracker.advance(self.next_read):
                self.dirty = True
            self.notify()
        return n

    def nack(self, offset: int, delay_ms: int | None = None, reason: str | None = None) -> bool:
        if not self.reliable:
            return False
        self._check_served()
        if self.tracker.take_back(offset) is None:
            return False
        for c in self.consumers.values():
            if c.queue:
                c.queue = deque(v for v in c.queue if frame_offset(v) != offset)
        if reason:
            log.info("message %d of %s nacked on %s: %s", offset, self.topic.name, self.name, reason)
        self._retry(offset, time.monotonic(), requested_ms=delay_ms, nack=True)
        self.notify()
        return True

    def _retry(self, offset: int, now: float, *, requested_ms: int | None = None, nack: bool = False) -> None:
        attempt = self.tracker.attempts.get(offset, 0) + 1
        policy = self.failure_policy
        if policy.max_redelivery_count and attempt > policy.max_redelivery_count:
            self._poison(offset)
            return
        self.tracker.attempts[offset] = attempt
        delay = policy.nack_delay_ms(attempt, requested_ms) if nack else policy.backoff_ms(attempt)
        self.tracker.schedule(offset, now + delay / 1000)

    def _poison(self, offset: int, problem: str | None = None) -> None:
        policy = self.failure_policy.poison_policy
        self.metrics.dropped(self.topic.name, self.name, 1, policy)
        if policy == "block":
            self.tracker.blocked.add(offset)
            return
        self.tracker.attempts.pop(offset, None)
        if policy == "dead_letter" and self._dead_letter is not None:
            self._dead_letter(self, offset)
        elif problem is not None:
            log.warning("message %d of %s dropped on %s: %s (poison policy drop)",
                        offset, self.topic.name, self.name, problem)
        else:
            log.warning("message %d of %s dropped on %s after %d redeliveries (poison policy drop)",
                        offset, self.topic.name, self.name, self.failure_policy.max_redelivery_count)
        if self.tracker.advance(self.next_read):
            self.dirty = True

    def _expire(self, now: float) -> None:
        deadline = self.tracker.next_deadline()
        if deadline is None or deadline > now:
            return
        offsets = self.tracker.expired(now)
        if offsets:
            for c in self.consumers.values():
                if c.queue:
                    gone = set(offsets)
                    c.queue = deque(v for v in c.queue if frame_offset(v) not in gone)
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
            name=self.name, sub_type=self.sub_type,
            consumers=len(self.active_consumers()), cursor=self.tracker.cursor,
            unacked=self.tracker.unacked,
            backlog=max(0, self.topic.readable_next - 1 - self.tracker.cursor),
        )
