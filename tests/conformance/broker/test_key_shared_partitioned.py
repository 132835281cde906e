"""danube-broker/tests/key_shared_partitioned.rs, test for test (client side: client/key_shared_partitioned.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("key_shared_partitioned")


def test_key_shared_partitioned_single_consumer(results):
    results.check("key_shared_partitioned_single_consumer")


def test_key_shared_partitioned_multi_consumer_affinity(results):
    results.check("key_shared_partitioned_multi_consumer_affinity")


def test_key_shared_consumer_churn_join(results):
    results.check("key_shared_consumer_churn_join")


def test_key_shared_reliable_partitioned(results):
    results.check("key_shared_reliable_partitioned")
