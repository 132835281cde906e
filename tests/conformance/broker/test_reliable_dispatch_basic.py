"""danube-broker/tests/reliable_dispatch_basic.rs, test for test (client side: client/reliable_dispatch_basic.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("reliable_dispatch_basic")


def test_reliable_basic_exclusive(results):
    results.check("reliable_basic_exclusive")


def test_reliable_basic_shared(results):
    results.check("reliable_basic_shared")
