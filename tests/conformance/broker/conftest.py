"""One broker for the session, as Danube's broker tests assume one broker at 127.0.0.1:6650
(each test on its own topics and subjects), started here on free ports."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.broker import running_broker
from tests.support.cluster import local_cluster


@dataclass
class Target:
    url: str
    admin_url: str


@pytest.fixture(scope="session")
def conformance_broker():
    with running_broker() as broker:
        yield Target(broker.url, f"http://127.0.0.1:{broker.admin_port}")


@pytest.fixture(scope="session")
def conformance_cluster(tmp_path_factory):
    """A 3-broker cluster (etcd + ``danube broker --etcd`` x3) on a shared file system, as Danube's
    topic-move tests need; the cluster variant of the dispatch files runs on it too.  Clients and
    admin calls go to the first broker."""
    with local_cluster(str(tmp_path_factory.mktemp("conformance-cluster")), storage="shared_fs") as cluster:
        first = cluster.procs[0]
        yield Target(first.url, first.admin_url)
