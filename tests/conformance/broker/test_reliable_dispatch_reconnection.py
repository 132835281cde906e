"""danube-broker/tests/reliable_dispatch_reconnection.rs, test for test (client side: client/reliable_dispatch_reconnection.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("reliable_dispatch_reconnection")


def test_reliable_exclusive_reconnection_resends_pending_message(results):
    results.check("reliable_exclusive_reconnection_resends_pending_message")


def test_reliable_shared_reconnection_failover_to_another_consumer(results):
    results.check("reliable_shared_reconnection_failover_to_another_consumer")


def test_reliable_multiple_reconnections_same_message(results):
    results.check("reliable_multiple_reconnections_same_message")
