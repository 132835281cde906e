"""danube-broker/tests/queuing_shared_round_robin.rs, test for test (client side: client/queuing_shared_round_robin.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("queuing_shared_round_robin")


def test_queue_shared_round_robin_distribution(results):
    results.check("queue_shared_round_robin_distribution")
