"""danube-broker/tests/subscription_basic.rs, test for test (client side: client/subscription_basic.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("subscription_basic")


def test_basic_subscription_shared(results):
    results.check("basic_subscription_shared")


def test_basic_subscription_exclusive(results):
    results.check("basic_subscription_exclusive")
