"""What the parts of :class:`~danube.broker.subscription.Subscription` (its reads, acks and push
delivery, each a base class in a module of its own) use of the state the subscription holds:
declared once here for the type checker, set by ``Subscription.__init__``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from danube.broker.contracts import Dispatcher
    from danube.broker.cursor import AckTracker
    from danube.broker.policies import DispatchSettings, FailurePolicy
    from danube.broker.stats import MetricsSink
    from danube.broker.topic import Topic


class SubscriptionState:
    if TYPE_CHECKING:
        topic: Topic
        name: str
        reliable: bool
        failure_policy: FailurePolicy
        settings: DispatchSettings
        metrics: MetricsSink
        tracker: AckTracker
        next_read: int
        early_acks: set[int]
        dispatcher: Dispatcher
        dirty: bool

        def notify(self) -> None: ...
