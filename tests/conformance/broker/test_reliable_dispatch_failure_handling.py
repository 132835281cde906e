"""danube-broker/tests/reliable_dispatch_failure_handling.rs, test for test (client side: client/reliable_dispatch_failure_handling.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("reliable_dispatch_failure_handling")


def test_reliable_exclusive_nack_redelivers_same_message(results):
    results.check("reliable_exclusive_nack_redelivers_same_message")


def test_reliable_shared_nack_redelivers_same_message(results):
    results.check("reliable_shared_nack_redelivers_same_message")


def test_reliable_exclusive_ack_timeout_redelivers_same_message(results):
    results.check("reliable_exclusive_ack_timeout_redelivers_same_message")


def test_reliable_retry_exhausted_block_prevents_progress(results):
    results.check("reliable_retry_exhausted_block_prevents_progress")


def test_reliable_retry_exhausted_drop_skips_poisoned_message(results):
    results.check("reliable_retry_exhausted_drop_skips_poisoned_message")


def test_reliable_retry_exhausted_deadletter_routes_message_to_dlq(results):
    results.check("reliable_retry_exhausted_deadletter_routes_message_to_dlq")
