"""One dispatcher per subscription type (as Danube's ``dispatcher/exclusive|shared|key_shared``).

A :class:`~danube.broker.subscription.Subscription` keeps its consumers, cursor, acks and
redelivery, and delegates to its dispatcher (the ``Dispatcher`` protocol of
``danube.broker.contracts``) who may join, who may receive and what a receive takes:

- exclusive (``exclusive.py``): one consumer; another name is refused while it is active.
- failover (``failover.py``): the first active consumer receives; the next takes over, with
  everything its predecessor left unacked, when it goes.
- shared (``shared.py``): whichever consumer asks next gets the next batch; receivers woken
  together fetch least recently served first, and what is available is split among those
  waiting, so consumers take turns.
- key_shared (``key_shared.py``): each message goes to the consumer the hash ring picks for its
  key (routing key, else producer name) among those whose glob filters accept it.

The first three deliver in offset order from the subscription's read position (``ordered.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.broker.dispatch.exclusive import ExclusiveDispatcher
from danube.broker.dispatch.failover import FailoverDispatcher
from danube.broker.dispatch.key_shared import KeySharedDispatcher
from danube.broker.dispatch.shared import SharedDispatcher
from danube.errors import InvalidArgumentError

if TYPE_CHECKING:
    from danube.broker.contracts import Dispatcher
    from danube.broker.subscription import Subscription

DISPATCHERS: dict[str, type[ExclusiveDispatcher | FailoverDispatcher | SharedDispatcher | KeySharedDispatcher]] = {
    cls.sub_type: cls for cls in (ExclusiveDispatcher, SharedDispatcher, FailoverDispatcher, KeySharedDispatcher)
}
SUB_TYPES = tuple(DISPATCHERS)  # ("exclusive", "shared", "failover", "key_shared")


def dispatcher_class(sub_type: str):
    """The dispatcher class of ``sub_type``; InvalidArgumentError for an unknown type."""
    cls = DISPATCHERS.get(sub_type)
    if cls is None:
        raise InvalidArgumentError(f"unknown subscription type {sub_type!r}; expected one of {', '.join(SUB_TYPES)}")
    return cls


def make_dispatcher(sub_type: str, subscription: Subscription) -> Dispatcher:
    return dispatcher_class(sub_type)(subscription)


__all__ = ["DISPATCHERS", "SUB_TYPES", "dispatcher_class", "make_dispatcher"]
