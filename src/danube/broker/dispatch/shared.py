"""Shared subscriptions: consumers take turns.

Whichever consumer asks next gets the next batch, but receivers woken together fetch least
recently served first, however quickly each one comes back for more, and what is available is
split among the consumers waiting at that moment."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from danube.broker.dispatch.ordered import OrderedDispatcher

if TYPE_CHECKING:
    from danube.broker.subscription import Consumer


def _last_turn(waiting: tuple[Consumer, asyncio.Future]) -> int:
    return waiting[0].last_turn


class SharedDispatcher(OrderedDispatcher):
    sub_type = "shared"

    __slots__ = ()

    def order_waiters(self, waiters: list[tuple[Consumer, asyncio.Future]]) -> None:
        waiters.sort(key=_last_turn)

    def fresh_limit(self, max_messages: int) -> int:
        # Split what is available among the consumers waiting now, so they take turns.
        sub = self.sub
        waiting = sum(1 for c in sub.consumers.values() if c.active and c.receiving)
        if waiting > 1:
            available = sub.topic.readable_next - sub.next_read
            max_messages = min(max_messages, max(1, -(-available // waiting)))
        return max_messages
