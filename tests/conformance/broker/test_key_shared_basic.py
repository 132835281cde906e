"""danube-broker/tests/key_shared_basic.rs, test for test (client side: client/key_shared_basic.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("key_shared_basic")


def test_key_shared_basic_single_consumer_non_reliable(results):
    results.check("key_shared_basic_single_consumer_non_reliable")


def test_key_shared_per_key_affinity_non_reliable(results):
    results.check("key_shared_per_key_affinity_non_reliable")


def test_key_shared_reliable_per_key_affinity(results):
    results.check("key_shared_reliable_per_key_affinity")


def test_key_shared_reliable_out_of_order_ack(results):
    results.check("key_shared_reliable_out_of_order_ack")
