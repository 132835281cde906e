"""danube-broker/tests/key_shared_safety.rs, test for test (client side: client/key_shared_safety.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("key_shared_safety")


def test_key_shared_reliable_drop_poison_skips_exhausted_message(results):
    results.check("key_shared_reliable_drop_poison_skips_exhausted_message")


def test_key_shared_reliable_block_poison_stalls_only_affected_key(results):
    results.check("key_shared_reliable_block_poison_stalls_only_affected_key")


def test_key_shared_reliable_deadletter_routes_to_dlq_and_frees_key(results):
    results.check("key_shared_reliable_deadletter_routes_to_dlq_and_frees_key")


def test_key_shared_reliable_inactive_consumer_eviction(results):
    results.check("key_shared_reliable_inactive_consumer_eviction")


def test_key_shared_reliable_nack_redelivers_same_message(results):
    results.check("key_shared_reliable_nack_redelivers_same_message")
