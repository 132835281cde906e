"""danube-broker/tests/reliable_topic_move_shared_fs.rs, test for test (client side:
client/reliable_topic_move_shared_fs.py).  Ignored upstream outside its shared-fs workflow; here it
runs on the session's shared-fs cluster (``conformance_cluster``)."""

import pytest

from tests.conformance.broker import harness
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def results(conformance_cluster):
    return harness.run("reliable_topic_move_shared_fs", conformance_cluster, timeout=480)


def test_reliable_topic_move_shared_fs_continues_offsets(results):
    results.check("reliable_topic_move_shared_fs_continues_offsets")


def test_reliable_topic_move_shared_fs_redelivers_unacked_message(results):
    results.check("reliable_topic_move_shared_fs_redelivers_unacked_message")


def test_reliable_topic_move__test_reliable_topic_move_with_offset_continuity(results):
    """reliable_topic_move.rs (deleted upstream in 7cbea0d, ignored there), from its last version."""
    results.check("reliable_topic_move__test_reliable_topic_move_with_offset_continuity")
