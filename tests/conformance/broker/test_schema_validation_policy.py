"""danube-broker/tests/schema_validation_policy.rs, test for test (client side: client/schema_validation_policy.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("schema_validation_policy")


def test_matching_schemas_end_to_end(results):
    results.check("matching_schemas_end_to_end")


def test_multiple_valid_payloads(results):
    results.check("multiple_valid_payloads")


def test_schema_evolution_consumer_compatibility(results):
    results.check("schema_evolution_consumer_compatibility")


def test_avro_schema_end_to_end(results):
    results.check("avro_schema_end_to_end")


def test_string_schema_type(results):
    results.check("string_schema_type")


def test_bytes_schema_type(results):
    results.check("bytes_schema_type")


def test_verify_schema_metadata_in_messages(results):
    results.check("verify_schema_metadata_in_messages")


def test_second_producer_different_subject_fails(results):
    results.check("second_producer_different_subject_fails")
