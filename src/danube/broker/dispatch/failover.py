"""Failover subscriptions: any number of consumers, one receives — the first active one (in the
order they joined).  When its stream ends the next takes over, with everything left unacked (the
subscription takes it back and schedules it for redelivery)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.broker.dispatch.ordered import OrderedDispatcher

if TYPE_CHECKING:
    from danube.broker.subscription import Consumer


class FailoverDispatcher(OrderedDispatcher):
    sub_type = "failover"

    __slots__ = ()

    def may_receive(self, consumer: Consumer) -> bool:
        for c in self.sub.consumers.values():
            if c.active:
                return c is consumer
        return False
