"""Danube broker tests deleted upstream, ported from their last version, test for test
(``test_<file>__<test>``; client side: client/deleted_upstream.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("deleted_upstream")


def test_subscription_exclusive__exclusive_subscription(results):
    results.check("subscription_exclusive__exclusive_subscription")


def test_subscription_shared__shared_subscription(results):
    results.check("subscription_shared__shared_subscription")


def test_partitioned_exclusive__part_exclusive_subscription(results):
    results.check("partitioned_exclusive__part_exclusive_subscription")


def test_partitioned_shared__part_shared_subscription(results):
    results.check("partitioned_shared__part_shared_subscription")


def test_reliable_dispatch_exclusive__reliable_exclusive_dispatch(results):
    results.check("reliable_dispatch_exclusive__reliable_exclusive_dispatch")


def test_reliable_dispatch_shared__reliable_shared_dispatch(results):
    results.check("reliable_dispatch_shared__reliable_shared_dispatch")


def test_non_partitioned_topic_test__test_exclusive_subscription(results):
    results.check("non_partitioned_topic_test__test_exclusive_subscription")


def test_non_partitioned_topic_test__test_shared_subscription(results):
    results.check("non_partitioned_topic_test__test_shared_subscription")


def test_partitioned_topic_test__test_exclusive_subscription(results):
    results.check("partitioned_topic_test__test_exclusive_subscription")


def test_partitioned_topic_test__test_shared_subscription(results):
    results.check("partitioned_topic_test__test_shared_subscription")


def test_reliable_dispatch_topic_test__test_reliable_exclusive_delivery(results):
    results.check("reliable_dispatch_topic_test__test_reliable_exclusive_delivery")


def test_reliable_dispatch_topic_test__test_reliable_shared_delivery(results):
    results.check("reliable_dispatch_topic_test__test_reliable_shared_delivery")


def test_reliable_shared_redelivery__reliable_shared_redelivery_to_other_consumer(results):
    results.check("reliable_shared_redelivery__reliable_shared_redelivery_to_other_consumer")
