"""Exclusive subscriptions: one active consumer; another name is refused while it is there."""

from __future__ import annotations

from danube.broker.dispatch.ordered import OrderedDispatcher
from danube.errors import AlreadyExistsError


class ExclusiveDispatcher(OrderedDispatcher):
    sub_type = "exclusive"

    __slots__ = ()

    def check_join(self, consumer_name: str) -> None:
        sub = self.sub
        for c in sub.consumers.values():
            if c.active and c.name != consumer_name:
                raise AlreadyExistsError(
                    f"subscription '{sub.name}' on topic {sub.topic.name} is exclusive and already has "
                    f"consumer '{c.name}'; use another subscription name or a shared/failover subscription"
                )
