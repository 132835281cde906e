"""danube-broker/tests/key_shared_filtering.rs, test for test (client side: client/key_shared_filtering.py)."""

import pytest

from tests.conformance.broker.harness import module_fixture

pytestmark = pytest.mark.timeout(400)
results = module_fixture("key_shared_filtering")


def test_key_shared_filter_glob_non_reliable(results):
    results.check("key_shared_filter_glob_non_reliable")


def test_key_shared_filter_glob_reliable(results):
    results.check("key_shared_filter_glob_reliable")


def test_key_shared_filter_mixed_with_unfiltered(results):
    results.check("key_shared_filter_mixed_with_unfiltered")


def test_key_shared_filter_multiple_patterns(results):
    results.check("key_shared_filter_multiple_patterns")
