"""One broker for the package's tests, as Danube's broker tests assume one broker at 127.0.0.1:6650
(each test on its own topics and subjects), started here on free ports."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from tests.support.broker import running_broker
from tests.support.cluster import local_cluster


@dataclass
class Target:
    url: str
    admin_url: str


@pytest.fixture(scope="package")
def conformance_broker():
    with running_broker() as broker:
        yield Target(broker.url, f"http://127.0.0.1:{broker.admin_port}")


@pytest.fixture(scope="package")
def conformance_cluster(tmp_path_factory):
    """A 3-broker cluster (etcd + ``danube broker --etcd`` x3) on a shared file system, as Danube's
    topic-move tests need; the cluster variant of the dispatch files runs on it too.  Clients and
    admin calls go to the first broker."""
    with local_cluster(str(tmp_path_factory.mktemp("conformance-cluster")), storage="shared_fs") as cluster:
        first = cluster.procs[0]
        yield Target(first.url, first.admin_url)


_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(session, config, items):
    """The cluster's tests last among this package's (in the package's own slots): the cluster
    starts at its first test and stops with the package, so it never idles while the others run."""
    slots = [i for i, item in enumerate(items) if str(item.path).startswith(_HERE + os.sep)]
    mine = [items[i] for i in slots]
    ordered = [it for it in mine if "conformance_cluster" not in it.fixturenames] + [
        it for it in mine if "conformance_cluster" in it.fixturenames
    ]
    for i, item in zip(slots, ordered):
        items[i] = item
