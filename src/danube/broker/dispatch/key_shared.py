"""Key-shared subscriptions: each message goes to the consumer the hash ring picks for its key.

A message's key is its routing key, else its producer's name; the ring
(``danube.broker.keyshared.HashRing``) maps it to a consumer among those whose glob key filters
accept it.  A receive routes a batch at a time: ready redeliveries and fresh frames are split
among the consumers' queues (each message tracked as delivered to its owner), and the receiving
consumer takes from its own queue.  A key no consumer accepts waits and is tried again shortly.

Under the block poison policy only the poisoned message's key stalls, as in Danube: later
messages of that key are parked (undelivered, holding the cursor) until the blocked message is
acked or released by an admin, then delivered in order; other keys keep flowing.

A consumer joining a subscription that has consumers takes keys over from them while they may
still hold earlier messages of those keys unacked (a live repartition makes this the rule: the
consumers of a subscription attach to a new partition one after the other while it fills).  So a
joined consumer gets a message read after it joined only once nothing read before it joined is in
flight at a consumer (acked, or taken back for redelivery: its join mark, as Pulsar's recently
joined consumers): routing stops at the first such message until then, keeping every key in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Collection

from danube import message_codec
from danube.broker.delivery import MUST_AWAIT, Delivery, MustAwait, frame_offset, split_frames
from danube.broker.keyshared import HashRing

if TYPE_CHECKING:
    from danube.broker.subscription import Consumer, Subscription

_UNROUTED_RETRY_S = 1.0  # a key no consumer accepts is tried again after this long


class KeySharedDispatcher:
    sub_type = "key_shared"
    takes_key_filters = True
    acks_release = True  # a key's next messages wait until its earlier ones are acked
    solo_in_order = False  # (routes by key, even to one consumer)

    __slots__ = ("sub", "ring", "_queues", "_keys", "_blocked_keys", "_parked", "_whole_block", "_joined_at")

    def __init__(self, subscription: Subscription) -> None:
        self.sub = subscription
        self.ring = HashRing()
        # consumer id -> frames routed to it, not yet delivered
        self._queues: dict[int, deque[memoryview]] = {}
        self._keys: dict[int, str] = {}  # offset -> key of what is in flight (reliable)
        self._blocked_keys: dict[str, int] = {}  # key -> its message held under the block policy
        self._parked: dict[str, list[int]] = {}  # key -> offsets held back behind that message
        self._whole_block = False  # a blocked message whose key is unknown stalls everything
        # consumer id -> the subscription's next read when it joined (while earlier reads are unacked)
        self._joined_at: dict[int, int] = {}

    @property
    def blocks_per_key(self) -> bool:
        return not self._whole_block

    def blocked(self, offset: int) -> None:
        key = self._keys.get(offset)
        if key is None:
            self._whole_block = True  # (a record that never reached a consumer: no key to hold)
        else:
            self._blocked_keys.setdefault(key, offset)

    def _release(self) -> None:
        """Keys whose blocked message was acked or released: their parked messages go out again."""
        tracker = self.sub.tracker
        if not tracker.blocked:
            self._whole_block = False
        for key, offset in list(self._blocked_keys.items()):
            if offset in tracker.blocked:
                continue
            del self._blocked_keys[key]
            for parked in self._parked.pop(key, ()):
                tracker.parked.discard(parked)
                tracker.schedule(parked, 0.0)

    def _prune_keys(self) -> None:
        cursor = self.sub.tracker.cursor
        blocked = set(self._blocked_keys.values())
        self._keys = {o: k for o, k in self._keys.items() if o > cursor or o in blocked}

    def check_join(self, consumer_name: str) -> None:
        return None

    def joined(self, consumer: Consumer) -> None:
        sub = self.sub
        low = sub.tracker.lowest_in_flight() if sub.reliable else None
        if len(self.ring) and low is not None and low < sub.next_read:
            self._joined_at.setdefault(consumer.id, sub.next_read)
        self.ring.add(consumer.id, consumer.key_filter)

    def left(self, consumer: Consumer) -> None:
        self.ring.remove(consumer.id)
        self._queues.pop(consumer.id, None)
        self._joined_at.pop(consumer.id, None)

    def _held(self, consumer_id: int, offset: int) -> bool:
        """Whether ``offset`` waits for what was read before ``consumer_id`` joined to be acked."""
        mark = self._joined_at.get(consumer_id)
        if mark is None or offset < mark:
            return False
        low = self.sub.tracker.lowest_in_flight()
        if low is None or low >= mark:  # what waits for redelivery goes to its key's owner first
            del self._joined_at[consumer_id]
            return False
        return True

    def restarted(self, consumer: Consumer) -> None:
        self._queues.pop(consumer.id, None)

    def may_receive(self, consumer: Consumer) -> bool:
        return True

    def order_waiters(self, waiters: list[tuple[Consumer, asyncio.Future]]) -> None:
        return None

    def forget(self, offsets: Collection[int]) -> None:
        queues = self._queues
        for consumer_id, queue in queues.items():
            if queue:
                queues[consumer_id] = deque(v for v in queue if frame_offset(v) not in offsets)

    # ------------------------------------------------------------ routing

    def _route_key(self, view: memoryview) -> str:
        rec, _ = message_codec.decode_frame(view, 0)
        assert rec is not None  # a whole frame (cut by the storage read)
        if rec.routing_key is not None:
            return rec.routing_key
        return self.sub.topic.producer_name(rec.producer_id)

    def _route(self, parts: list[memoryview], now: float, fresh: bool = False) -> int:
        """Routes ``parts`` to their consumers' queues; how many were routed (fresh reads stop at a
        message held for a joined consumer, the rest is read again)."""
        sub = self.sub
        reliable = sub.reliable
        tracker = sub.tracker
        queues = self._queues
        deadline = now + sub.failure_policy.ack_timeout_ms / 1000
        blocked_keys = self._blocked_keys
        joined = self._joined_at
        for i, view in enumerate(parts):
            offset = frame_offset(view)
            key = self._route_key(view)
            owner_id = self.ring.owner(key)
            if joined and owner_id is not None and fresh and self._held(owner_id, offset):
                return i
            if reliable:
                if key in blocked_keys and blocked_keys[key] != offset:
                    tracker.parked.add(offset)
                    self._parked.setdefault(key, []).append(offset)
                    continue
                self._keys[offset] = key
            owner = sub.consumers.get(owner_id) if owner_id is not None else None
            if owner is None:
                # No consumer accepts this key now; try again shortly (never dropped).
                if reliable:
                    tracker.schedule(offset, now + _UNROUTED_RETRY_S)
                continue
            queue = queues.get(owner.id)
            if queue is None:
                queue = queues[owner.id] = deque()
            queue.append(view)
            if reliable:
                tracker.delivered(offset, offset, owner.id, deadline)
        return len(parts)

    # ------------------------------------------------------------ receive

    def fetch_now(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> MustAwait:
        """Routing reads and splits a batch among the consumers' queues: always the awaited fetch."""
        return MUST_AWAIT

    async def fetch(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        sub = self.sub
        if self._blocked_keys or self._whole_block:
            self._release()
        if len(self._keys) > 2 * sub.settings.max_unacked_messages + 1024:
            self._prune_keys()
        if not self._queues.get(consumer.id):
            settings = sub.settings
            async with sub.read_lock:
                if sub.reliable and sub.tracker.has_ready(now):
                    offsets = sub.tracker.pop_ready(now, settings.max_batch_messages)
                    ready = [v for v in [await sub.frame_at(o) for o in offsets] if v is not None]
                    self._route(ready, now)
                if not self._queues.get(consumer.id):
                    window = sub.window()
                    if window > 0:
                        view, count = await sub.read_fresh(
                            min(window, settings.max_batch_messages), settings.max_batch_bytes
                        )
                        if view is not None:
                            routed = self._route(split_frames(view), now, fresh=True)
                            sub.next_read += routed
                            if not sub.reliable:
                                sub.tracker.cursor = sub.next_read - 1
                            if routed:
                                sub.notify()
        queue = self._queues.get(consumer.id)  # (taken again: a nack or a timeout may replace it)
        if not queue:
            return None
        parts: list[memoryview] = []
        size = 0
        while queue and len(parts) < max_messages:
            view = queue[0]
            if parts and size + len(view) > max_bytes:
                break
            queue.popleft()
            parts.append(view)
            size += len(view)
        offsets = [frame_offset(v) for v in parts]
        attempts = sub.tracker.attempts
        counts = {o: attempts[o] for o in offsets if o in attempts}
        buf = parts[0] if len(parts) == 1 else b"".join(parts)
        return Delivery(buf, min(offsets), max(offsets), len(parts), counts)
