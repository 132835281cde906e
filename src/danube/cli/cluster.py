"""`danube cluster up`: etcd and N brokers on free loopback ports, for development and tests.

Prints ONE JSON line once every broker is registered and a leader is elected::

    {"etcd": "http://127.0.0.1:P", "leader": "broker-1", "base_dir": "...",
     "brokers": [{"broker_id": "broker-1", "url": "http://127.0.0.1:P1", "admin_url": ..., "pid": ...,
                  "data_dir": ..., "log": ...}, ...]}

(``--json`` prints only that line; without it a short human summary follows on
stderr.)  Ctrl-C or SIGTERM stops every broker, then etcd, each by its own PID.
``LocalCluster`` is also what the cluster tests and ``bench/cluster_assign.py`` use.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Sequence

from danube.cluster.etcd_server import EtcdServer
from danube.processes import free_ports, stop_process, wait_for_port

log = logging.getLogger("danube.cluster")

STORAGE_MODES = ("local", "shared_fs", "object_store")
S3_BUCKET = "danube-cluster"


@dataclass
class BrokerProc:
    broker_id: str
    port: int
    admin_port: int
    data_dir: str
    log_path: str
    cmd: list[str]
    proc: subprocess.Popen | None = None
    metrics_port: int = 0  # Prometheus port, 0 = off (LocalCluster(metrics=True) / cluster up --metrics)
    scheme: str = "http"  # https when the brokers' config turns TLS on (what they advertise)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.admin_port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 60.0) -> None:
        log_file = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        finally:
            log_file.close()
        try:
            wait_for_port(self.port, self.proc, timeout)
        except BaseException:
            self.stop()
            raise RuntimeError(f"broker {self.broker_id} did not start; log:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        return stop_process(self.proc, timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def describe(self) -> dict:
        described = {
            "broker_id": self.broker_id,
            "url": self.url,
            "admin_url": self.admin_url,
            "pid": self.pid,
            "data_dir": self.data_dir,
            "log": self.log_path,
        }
        if self.metrics_port:
            described["metrics_url"] = self.metrics_url
        return described


@dataclass
class LocalCluster:
    """etcd + ``brokers`` broker subprocesses on loopback; everything stopped by PID in :meth:`stop`.

    ``config``: a broker config file handed to every broker (also to those :meth:`add_broker` starts
    later); with ``storage`` other than local, its storage section is added to a copy of the file.
    ``metrics``: every broker serves Prometheus metrics on a free port (``BrokerProc.metrics_url``)."""

    brokers: int = 3
    base_dir: str | None = None
    storage: str = "local"
    config: str | None = None
    lease_ttl: int = 10
    load_report_interval: float = 5.0
    # export_interval_seconds of the storage section this cluster writes (shared_fs, object_store)
    export_interval: float = 5.0
    extra_args: Sequence[str] = ()
    log_level: str = "INFO"
    metrics: bool = False
    etcd: EtcdServer | None = None
    procs: list[BrokerProc] = field(default_factory=list)
    s3: subprocess.Popen | None = None  # moto's S3 server for --storage object_store
    s3_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.storage not in STORAGE_MODES:
            raise ValueError(f"storage must be one of {STORAGE_MODES}, got {self.storage!r}")
        self.base_dir = os.path.abspath(self.base_dir or tempfile.mkdtemp(prefix="danube-cluster-"))

    def _user_config(self) -> dict | None:
        """The ``config`` file's mapping (None without one)."""
        if not self.config:
            return None
        import yaml

        with open(self.config, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{self.config}: expected a mapping")
        return data

    def _tls(self) -> bool:
        """The brokers' ports speak TLS (the config file's auth block, or --tls-cert among the extra args)."""
        auth = (self._user_config() or {}).get("auth") or {}
        mode = str(auth.get("mode", "") or "").lower() if isinstance(auth, dict) else ""
        return mode in ("tls", "tlswithjwt", "tls_with_jwt") or "--tls-cert" in self.extra_args

    def _storage_from_config(self) -> bool:
        """The config file has its own storage section: it wins over ``storage`` (e.g. a real bucket)."""
        data = self._user_config()
        return data is not None and "storage" in data

    def _config_args(self, index: int) -> list[str]:
        if self.storage == "local" or self._storage_from_config():
            return ["--config", self.config] if self.config else []
        path = os.path.join(self.base_dir, f"storage-{index}.yml")
        if self.storage == "object_store":
            # every broker's durable segments in one bucket of a local S3 server (moto)
            text = (
                f"storage:\n  mode: object_store\n  durable:\n    backend: s3\n    root: {S3_BUCKET}/danube\n"
                f"    endpoint: {self.s3_endpoint}\n    region: us-east-1\n    access_key: testing\n"
                f"    secret_key: testing\n"
            )
        else:  # shared_fs: every broker's durable segments in one shared directory
            shared = os.path.join(self.base_dir, "durable")
            os.makedirs(shared, exist_ok=True)
            text = f"storage:\n  mode: shared_fs\n  durable:\n    root: {shared}\n"
        # A development cluster is watched live (danube spark load-stats, the console's charts): its
        # durable history should trail by seconds, not by the broker's production default.
        text += f"  export_interval_seconds: {self.export_interval:g}\n"
        data = self._user_config()
        if data is not None:  # the user's file with the storage section of --storage
            import yaml

            data.update(yaml.safe_load(text))
            text = yaml.safe_dump(data, sort_keys=False)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold keys
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return ["--config", path]

    def _start_s3(self, timeout: float) -> None:
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "--storage object_store runs a local S3 server (moto): pip install 'moto[server]' "
                f"boto3, or pass --config with your own bucket ({exc})"
            ) from None
        (port,) = free_ports(1)
        log_file = open(os.path.join(self.base_dir, "s3.log"), "ab")
        try:
            self.s3 = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log_file.close()
        wait_for_port(port, self.s3, timeout)
        self.s3_endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.s3_endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=S3_BUCKET)

    def broker_cmd(
        self, broker_id: str, port: int, admin_port: int, data_dir: str, index: int, metrics_port: int = 0
    ) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "danube.cli.main",
            "--log-level",
            self.log_level,
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
            "--cluster",
            "--etcd",
            self.etcd.url,
            "--broker-id",
            broker_id,
            "--lease-ttl",
            str(self.lease_ttl),
            "--load-report-interval",
            str(self.load_report_interval),
        ]
        return cmd + self._config_args(index) + list(self.extra_args)

    def add_broker(self, index: int) -> BrokerProc:
        """Prepare broker ``broker-{index}`` (``.start()`` runs it: a broker joining a running cluster)."""
        broker_id = f"broker-{index}"
        port, admin_port, metrics_port = free_ports(3)
        metrics_port = metrics_port if self.metrics else 0
        data_dir = os.path.join(self.base_dir, broker_id)
        os.makedirs(data_dir, exist_ok=True)
        proc = BrokerProc(
            broker_id,
            port,
            admin_port,
            data_dir,
            os.path.join(data_dir, "broker.log"),
            self.broker_cmd(broker_id, port, admin_port, data_dir, index, metrics_port),
            metrics_port=metrics_port,
            scheme="https" if self._tls() else "http",
        )
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 60.0) -> None:
        try:
            self.etcd = EtcdServer(os.path.join(self.base_dir, "etcd"))
            self.etcd.start()
            if self.storage == "object_store" and not self._storage_from_config():
                self._start_s3(timeout)
            for i in range(1, self.brokers + 1):
                self.add_broker(i)
            for p in self.procs:
                log_file = open(p.log_path, "ab")
                try:
                    p.proc = subprocess.Popen(
                        p.cmd,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                finally:
                    log_file.close()
            for p in self.procs:
                try:
                    wait_for_port(p.port, p.proc, timeout)
                except BaseException:
                    raise RuntimeError(f"broker {p.broker_id} did not start; log:\n{p.log()[-4000:]}")
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float = 60.0) -> str:
        """Every live broker registered and a leader elected; returns the leader id."""
        wanted = {p.broker_id for p in self.procs if p.alive()}
        deadline = time.monotonic() + timeout
        while True:
            state = self.state()
            if wanted <= set(state["registered"]) and state["leader"] in wanted:
                return state["leader"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ready after {timeout:.0f} s: {state}")
            time.sleep(0.1)

    def state(self) -> dict:
        """Registrations, leader and assignments, read straight from etcd."""
        return asyncio.run(read_state(self.etcd.url))

    def stop(self) -> None:
        """SIGTERM every broker at once (each leaves the cluster while etcd still runs), wait for
        them (SIGKILL after 15 s), then stop etcd."""
        for p in self.procs:
            if p.alive():
                try:
                    p.proc.terminate()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.stop()
            except Exception:  # noqa: BLE001 - stop the others anyway
                log.exception("stopping %s failed", p.broker_id)
        if self.etcd is not None:
            self.etcd.stop()
        if self.s3 is not None:
            stop_process(self.s3)

    def describe(self, leader: str | None = None) -> dict:
        return {
            "etcd": self.etcd.url if self.etcd else None,
            "etcd_pid": self.etcd.pid if self.etcd else None,
            "s3": self.s3_endpoint,
            "s3_pid": self.s3.pid if self.s3 else None,
            "leader": leader,
            "base_dir": self.base_dir,
            "storage": self.storage,
            "brokers": [p.describe() for p in self.procs],
        }

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


async def read_state(etcd_url: str) -> dict:
    from danube.metadata import keys
    from danube.metadata.etcd import EtcdMetadataStore

    store = EtcdMetadataStore(etcd_url, retry_timeout=5)
    try:
        kvs = await store.get_prefix(keys.cluster_prefix())
    finally:
        await store.close()
    state: dict = {"registered": {}, "leader": None, "assignments": {}, "unassigned": []}
    for kv in kvs:
        parts = kv.key.split("/")
        if parts[2] == "register" and len(parts) == 4:
            state["registered"][parts[3]] = json.loads(kv.value)
        elif parts[2] == "leader":
            state["leader"] = kv.value.decode()
        elif parts[2] == "brokers" and len(parts) == 6:
            state["assignments"][f"/{parts[4]}/{parts[5]}"] = parts[3]
        elif parts[2] == "unassigned" and len(parts) == 5:
            state["unassigned"].append(f"/{parts[3]}/{parts[4]}")
    return state


# ---------------------------------------------------------------- CLI


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "cluster", help="run a local cluster (etcd + N brokers) for development", description=__doc__.split("\n\n")[0]
    )
    sub = p.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND")
    up = sub.add_parser("up", help="start etcd and N brokers on free loopback ports until Ctrl-C / SIGTERM")
    up.add_argument("--brokers", type=int, default=3, help="how many brokers [default 3]")
    up.add_argument(
        "--storage",
        choices=STORAGE_MODES,
        default="local",
        help="local = each broker its own WAL; shared_fs = durable segments in a directory every "
        "broker shares; object_store = in a bucket of a local S3 server (moto) [default local]",
    )
    up.add_argument("--base-dir", default=None, help="where etcd and the brokers keep their data [default a temp dir]")
    up.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a broker config file passed to every broker (flags still set ports, ids and etcd)",
    )
    up.add_argument("--lease-ttl", type=int, default=10, help="broker lease TTL in seconds [default 10]")
    up.add_argument(
        "--load-report-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="LoadReport interval of each broker [default 5]",
    )
    up.add_argument(
        "--export-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="with --storage shared_fs or object_store: each broker exports its committed WAL to "
        "durable history this often, so Spark (danube spark load-stats, the data source) sees "
        "messages at most this long after they were acknowledged (a config file with its own "
        "storage section keeps its own setting) [default 5; the broker's own default is 300]",
    )
    up.add_argument(
        "--metrics",
        action="store_true",
        help="every broker serves Prometheus metrics on a free port (metrics_url in the JSON line)",
    )
    up.add_argument("--json", action="store_true", help="print only the JSON line (for scripts)")
    up.set_defaults(func=run_up)
    from danube.cli import simulate  # danube cluster simulate SCENARIO (docs/rebalancing.md)

    simulate.register(sub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_up(args) -> int:
    if args.brokers < 1:
        log.error("--brokers must be at least 1")
        return 2
    if not args.export_interval >= 0.01:
        log.error("--export-interval must be at least 0.01 seconds, got %s", args.export_interval)
        return 2
    cluster = LocalCluster(
        brokers=args.brokers,
        base_dir=args.base_dir,
        storage=args.storage,
        config=args.config,
        lease_ttl=args.lease_ttl,
        load_report_interval=args.load_report_interval,
        export_interval=args.export_interval,
        log_level="WARNING" if args.json else "INFO",
        metrics=args.metrics,
    )
    stopping = {"flag": False}

    def on_signal(signum, frame):  # noqa: ARG001
        stopping["flag"] = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        try:
            cluster.start()
            leader = cluster.wait_ready()
        except KeyboardInterrupt:
            return 0
        except (RuntimeError, TimeoutError) as exc:
            log.error("%s", exc)
            return 1
        print(json.dumps(cluster.describe(leader), separators=(",", ":")), flush=True)
        if not args.json:
            print(
                f"etcd {cluster.etcd.url}; brokers: "
                + ", ".join(f"{p.broker_id} {p.url}" for p in cluster.procs)
                + f"; leader {leader}. Ctrl-C stops everything.",
                file=sys.stderr,
                flush=True,
            )
        reported: set[str] = set()
        try:
            while True:
                time.sleep(0.5)
                for p in cluster.procs:
                    if p.broker_id not in reported and not p.alive():
                        reported.add(p.broker_id)
                        log.warning(
                            "broker %s exited with code %s (log %s)",
                            p.broker_id,
                            p.proc.returncode if p.proc else None,
                            p.log_path,
                        )
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            cluster.stop()
        except KeyboardInterrupt:
            cluster.stop()
