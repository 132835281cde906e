"""danube-broker/tests/consumer_churn.rs, test for test (client side: client/consumer_churn.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("consumer_churn")


def test_churn_shared_queue_join_leave(results):
    results.check("churn_shared_queue_join_leave")


def test_churn_exclusive_fanout_join_leave(results):
    results.check("churn_exclusive_fanout_join_leave")
