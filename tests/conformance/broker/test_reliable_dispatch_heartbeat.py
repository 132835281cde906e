"""danube-broker/tests/reliable_dispatch_heartbeat.rs, test for test (client side: client/reliable_dispatch_heartbeat.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("reliable_dispatch_heartbeat")


def test_notification_coalescing_recovery(results):
    results.check("notification_coalescing_recovery")


def test_subscription_creation_race_condition(results):
    results.check("subscription_creation_race_condition")


def test_consumer_disconnect_during_notification(results):
    results.check("consumer_disconnect_during_notification")


def test_poll_next_returns_none_recovery(results):
    results.check("poll_next_returns_none_recovery")
