"""Beyond Danube's suite: its scenarios against a 3-broker cluster (etcd, ``danube broker --etcd``
x3 on a shared file system; ``conformance_cluster``), the client and the admin calls going to the
first broker, which redirects lookups to each topic's owner.

Every file that runs against the single broker runs here too (except ``security_e2e``, which needs
its secured broker), plus ``client/cluster_only.py`` (a dead-letter topic on another broker); all
in one danube-client subprocess.
"""

import re
from pathlib import Path

import pytest

from tests.conformance.broker import harness
from tests.support.etcd import requires_etcd

pytestmark = [requires_etcd, pytest.mark.timeout(600)]

MODULES = [
    "reliable_dispatch_failure_handling",
    "key_shared_safety",
    "reliable_dispatch_reconnection",
    "subscription_basic",
    "partitioned_basic",
    "pubsub_fanout_exclusive",
    "queuing_shared_round_robin",
    "key_shared_basic",
    "consumer_churn",
    "key_shared_filtering",
    "key_shared_partitioned",
    "partitioned_variants",
    "partitioning_validation",
    "producer_reconnect",
    "reliable_dispatch_basic",
    "reliable_dispatch_heartbeat",
    "deleted_upstream",
    "schema_compatibility",
    "schema_registry_basic",
    "schema_validation_policy",
    "schema_version_selection",
    "topic_schema_config",
    "cluster_only",
]
# ignored upstream as a multi-broker case (cross-broker eviction); it runs single-broker only
SKIP = {"key_shared_safety::key_shared_reliable_inactive_consumer_eviction"}


def _scenarios():
    for module in MODULES:
        text = (Path(harness.CLIENT_DIR) / f"{module}.py").read_text()
        for name in re.findall(r"^async def test_(\w+)", text, re.M):
            if f"{module}::{name}" not in SKIP:
                yield f"{module}::{name}"


SCENARIOS = list(_scenarios())


@pytest.fixture(scope="module")
def cluster_results(conformance_cluster):
    return harness.run(",".join(MODULES), conformance_cluster, only=SCENARIOS, timeout=480)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cluster(cluster_results, scenario):
    cluster_results.check(scenario)
