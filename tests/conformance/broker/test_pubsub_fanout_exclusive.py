"""danube-broker/tests/pubsub_fanout_exclusive.rs, test for test (client side: client/pubsub_fanout_exclusive.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("pubsub_fanout_exclusive")


def test_pubsub_fanout_exclusive_unique_subscriptions(results):
    results.check("pubsub_fanout_exclusive_unique_subscriptions")
