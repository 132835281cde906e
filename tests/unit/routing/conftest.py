"""Routing tests run against the embedded store; tests/integration/routing runs the ones that take
``metadata`` again against a real etcd."""

import pytest

from danube.metadata.embedded import EmbeddedMetadataStore


@pytest.fixture
async def metadata(tmp_path):
    store = EmbeddedMetadataStore(str(tmp_path / "meta.db"))
    try:
        yield store
    finally:
        await store.close()
