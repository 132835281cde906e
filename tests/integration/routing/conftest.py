"""The routing tests of tests/unit/routing that take ``metadata``, run again against a real etcd
(one server for the package, every key wiped before each test)."""

import pytest

from tests.support.etcd import etcd_or_skip, wiped_store


@pytest.fixture(scope="package")
def etcd_server(tmp_path_factory):
    yield from etcd_or_skip(tmp_path_factory)


@pytest.fixture
async def metadata(etcd_server):
    async with wiped_store(etcd_server) as store:
        yield store
