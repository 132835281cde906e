"""danube-broker/tests/partitioned_basic.rs, test for test (client side: client/partitioned_basic.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("partitioned_basic")


def test_partitioned_basic_exclusive(results):
    results.check("partitioned_basic_exclusive")


def test_partitioned_basic_shared(results):
    results.check("partitioned_basic_shared")
