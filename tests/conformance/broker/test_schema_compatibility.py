"""danube-broker/tests/schema_compatibility.rs, test for test (client side: client/schema_compatibility.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("schema_compatibility")


def test_backward_compatibility_add_optional_field(results):
    results.check("backward_compatibility_add_optional_field")


def test_backward_compatibility_remove_required_field_fails(results):
    results.check("backward_compatibility_remove_required_field_fails")


def test_forward_compatibility_remove_optional_field(results):
    results.check("forward_compatibility_remove_optional_field")


def test_forward_compatibility_add_required_field_fails(results):
    results.check("forward_compatibility_add_required_field_fails")


def test_full_compatibility_strict_evolution(results):
    results.check("full_compatibility_strict_evolution")


def test_compatibility_none_allows_breaking_changes(results):
    results.check("compatibility_none_allows_breaking_changes")


def test_avro_backward_compatibility(results):
    results.check("avro_backward_compatibility")


def test_check_compatibility_before_registration(results):
    results.check("check_compatibility_before_registration")


def test_multiple_versions_evolution(results):
    results.check("multiple_versions_evolution")
