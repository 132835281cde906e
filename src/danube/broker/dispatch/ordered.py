"""Delivery in offset order from the subscription's read position: what exclusive, failover and
shared subscriptions have in common (they differ only in who may join, who may receive and how
waiting receivers share)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Collection

from danube.broker.delivery import MUST_AWAIT, MustAwait

if TYPE_CHECKING:
    from danube.broker.delivery import Delivery
    from danube.broker.subscription import Consumer, Subscription


class OrderedDispatcher:
    """Ready redeliveries first, then fresh frames from the read position; no join rule."""

    sub_type = ""
    takes_key_filters = False
    blocks_per_key = False  # a blocked poison message stalls the subscription: order is the promise
    acks_release = False  # nothing waits on an ack but the unacked window
    # With one consumer, may_receive is true for it while it is active and fresh_limit takes
    # nothing off: the subscription may push fresh frames to it without asking (subscription_push)
    solo_in_order = True

    __slots__ = ("sub",)

    def __init__(self, subscription: Subscription) -> None:
        self.sub = subscription

    def check_join(self, consumer_name: str) -> None:
        return None

    def joined(self, consumer: Consumer) -> None:
        return None

    def left(self, consumer: Consumer) -> None:
        return None

    def restarted(self, consumer: Consumer) -> None:
        return None

    def may_receive(self, consumer: Consumer) -> bool:
        return True

    def order_waiters(self, waiters: list[tuple[Consumer, asyncio.Future]]) -> None:
        return None

    def forget(self, offsets: Collection[int]) -> None:
        return None  # nothing is held per consumer: a taken-back offset waits in the tracker

    def blocked(self, offset: int) -> None:
        return None

    def fresh_limit(self, max_messages: int) -> int:
        """How many fresh messages this receive may take (before the unacked window)."""
        return max_messages

    async def fetch(self, consumer: Consumer, max_messages: int, max_bytes: int, now: float) -> Delivery | None:
        sub = self.sub
        async with sub.read_lock:
            if sub.reliable and sub.tracker.has_ready(now):
                delivery = await sub.redeliver(consumer, max_messages, max_bytes, now)
                if delivery is not None:
                    return delivery
            return await sub.deliver_fresh(consumer, self.fresh_limit(max_messages), max_bytes, now)

    def fetch_now(
        self, consumer: Consumer, max_messages: int, max_bytes: int, now: float
    ) -> Delivery | None | MustAwait:
        """``fetch`` without an await or the read lock (no read holds it): fresh frames the
        storage has at hand; ``MUST_AWAIT`` when a redelivery is due or the storage must wait."""
        if not self.may_receive(consumer):
            return None
        sub = self.sub
        if sub.reliable and sub.tracker.has_ready(now):
            return MUST_AWAIT
        return sub.deliver_fresh_now(consumer, self.fresh_limit(max_messages), max_bytes, now)
