"""danube-broker/tests/schema_registry_basic.rs, test for test (client side: client/schema_registry_basic.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("schema_registry_basic")


def test_schema_registration_multiple_types(results):
    results.check("schema_registration_multiple_types")


def test_producer_with_registered_schema_succeeds(results):
    results.check("producer_with_registered_schema_succeeds")


def test_producer_with_unregistered_schema_fails(results):
    results.check("producer_with_unregistered_schema_fails")


def test_producer_without_schema_works(results):
    results.check("producer_without_schema_works")


def test_schema_versioning_evolution(results):
    results.check("schema_versioning_evolution")


def test_consumer_receives_schema_metadata(results):
    results.check("consumer_receives_schema_metadata")


def test_multiple_producers_same_schema(results):
    results.check("multiple_producers_same_schema")
