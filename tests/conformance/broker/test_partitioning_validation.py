"""danube-broker/tests/partitioning_validation.rs, test for test (client side: client/partitioning_validation.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("partitioning_validation")


def test_partitioning_validation(results):
    results.check("partitioning_validation")
