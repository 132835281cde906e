"""danube-broker/tests/topic_schema_config.rs, test for test (client side: client/topic_schema_config.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("topic_schema_config")


def test_first_producer_assigns_schema(results):
    results.check("first_producer_assigns_schema")


def test_second_producer_different_schema_fails(results):
    results.check("second_producer_different_schema_fails")


def test_producer_without_schema_can_connect(results):
    results.check("producer_without_schema_can_connect")


def test_topic_allows_different_versions_same_subject(results):
    results.check("topic_allows_different_versions_same_subject")
