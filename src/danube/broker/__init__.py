"""The broker: topics, producers, subscriptions, dispatch and cursors.

``BrokerService`` (``danube.broker.service``) is the only object the server
edges use; see ``docs/internals.md``.
"""

from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.broker.service import BrokerService, Delivery, LookupResult

__all__ = ["BrokerService", "Delivery", "LookupResult", "TopicPolicies", "FailurePolicy", "DispatchSettings"]
