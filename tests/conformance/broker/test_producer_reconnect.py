"""danube-broker/tests/producer_reconnect.rs, test for test (client side: client/producer_reconnect.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("producer_reconnect")


def test_producer_reconnection_reuse(results):
    results.check("producer_reconnection_reuse")
