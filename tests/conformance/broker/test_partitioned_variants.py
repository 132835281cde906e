"""danube-broker/tests/partitioned_variants.rs, test for test (client side: client/partitioned_variants.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("partitioned_variants")


def test_partitioned_queue_shared_distribution_and_partition_coverage(results):
    results.check("partitioned_queue_shared_distribution_and_partition_coverage")


def test_partitioned_pubsub_fanout_exclusive_full_receipt(results):
    results.check("partitioned_pubsub_fanout_exclusive_full_receipt")
