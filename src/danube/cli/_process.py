"""`danube broker` as a child process for the CLI and the benchmarks (`danube demo`, `danube bench
--spawn-broker`, the peer benchmarks); the generic helpers live in `danube.processes` and are
re-exported here for the callers that import them from this module."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Iterator

from danube.processes import (  # noqa: F401 - re-exported
    accepts_connections,
    cpu_seconds,
    free_port,
    free_ports,
    server_process,
    stop_process,
    thread_count,
    wait_for_port,
)


@dataclass
class BrokerProcess:
    port: int
    data_dir: str
    proc: subprocess.Popen

    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def spawned_broker(
    sync: str = "always",
    data_dir: str | None = None,
    *,
    log_path: str | None = None,
    keep_data_dir: bool = False,
    grpc_server: str | None = None,
) -> Iterator[BrokerProcess]:
    """`danube broker` on free loopback ports for the block; a temporary data dir unless one is given;
    ``grpc_server`` picks what serves its client port (the broker's default when None)."""
    own_dir = data_dir is None
    data_dir = data_dir or tempfile.mkdtemp(prefix="danube-broker-")
    port, admin_port, metrics_port = free_ports(3)
    cmd = [
        sys.executable,
        "-m",
        "danube.cli.main",
        "broker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-port",
        str(admin_port),
        "--metrics-port",
        str(metrics_port),
        "--data-dir",
        data_dir,
        "--sync",
        sync,
    ] + (["--grpc-server", grpc_server] if grpc_server else [])
    try:
        with server_process(cmd, port, log_path=log_path, stop_timeout=20.0) as proc:
            yield BrokerProcess(port, data_dir, proc)
    finally:
        if own_dir and not keep_data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
