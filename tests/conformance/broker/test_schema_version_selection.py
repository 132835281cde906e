"""danube-broker/tests/schema_version_selection.rs, test for test (client side: client/schema_version_selection.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("schema_version_selection")


def test_producer_pin_to_specific_version(results):
    results.check("producer_pin_to_specific_version")


def test_producer_minimum_version_uses_latest(results):
    results.check("producer_minimum_version_uses_latest")


def test_multiple_producers_different_versions(results):
    results.check("multiple_producers_different_versions")


def test_producer_invalid_version_fails(results):
    results.check("producer_invalid_version_fails")


def test_producer_no_version_uses_latest(results):
    results.check("producer_no_version_uses_latest")


def test_producer_minimum_version_at_boundary(results):
    results.check("producer_minimum_version_at_boundary")
