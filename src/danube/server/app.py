"""The broker process: gRPC servers on uvloop around one BrokerService.

Client port (6650): Danube's services plus the batch lane, served by danube's own
gRPC-over-HTTP/2 server on the event loop (``grpc_server: native``, the default) or by
grpc.aio (``grpc_server: grpcio``).  Admin port (50051):
the admin service.  Metrics port (9040): Prometheus.  SIGTERM/SIGINT stop
accepting, let in-flight calls finish briefly, persist cursors, close storage
and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import TYPE_CHECKING, Callable, cast

import grpc

from danube import _allocator, _gctune
from danube.broker.service import BrokerService
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.server import danube_services
from danube.server.config import BrokerConfig
from danube.server.h2grpc.limits import H2Limits
from danube.server.metrics import PrometheusMetrics
from danube.server.rpc_counts import CountingInterceptor, RpcCounts

if TYPE_CHECKING:
    from danube.cluster.load_report import LoadReporter
    from danube.cluster.node import ClusterNode
    from danube.metadata.store import MetadataStore

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # either gRPC server, both directions
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
STOP_GRACE_S = 2.0


def _optional_edge(module: str):
    """An optional edge module (batch lane, admin); None only when that exact module is absent."""
    import importlib

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


class BrokerApp:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: BrokerService | None = None
        self.metadata: MetadataStore | None = None
        self.server: grpc.aio.Server | None = None
        self.admin_server: grpc.aio.Server | None = None
        self.metrics: PrometheusMetrics | None = None
        self.schema_gate = None
        self.bound: dict[str, int] = {}
        self.cluster: ClusterNode | None = None  # in cluster mode
        self.load_reporter: LoadReporter | None = None  # of a standalone broker
        self.scalable = None  # danube.server.scalable_service.ScalableTopicService

    async def start(self) -> None:
        from danube.storage.factory import StorageFactory

        cfg = self.config
        os.makedirs(cfg.data_dir, exist_ok=True)
        if cfg.metadata_dir and not cfg.cluster:
            os.makedirs(cfg.metadata_dir, exist_ok=True)
        # a descriptor or two per open topic and one per connection: the soft limit up to the hard one
        from danube.server.limits import raise_nofile_limit

        raise_nofile_limit(log)
        storage_config = cfg.storage_config()
        self.metadata = self._metadata_store(cfg)
        factory = StorageFactory(storage_config, self.metadata, broker_id=cfg.broker_id)
        self.metrics = PrometheusMetrics()
        self.broker = BrokerService(
            self.metadata,
            factory,
            broker_url=cfg.broker_url,
            broker_id=cfg.broker_id,
            policies=cfg.policies,
            failure_policy=cfg.failure_policy,
            dispatch=cfg.dispatch,
            metrics=self.metrics,
        )
        self.metrics.attach(self.broker)
        self.broker.auto_create_topics = cfg.auto_create_topics
        from danube.routing.repartition import runtime as repartition_runtime  # live repartition (docs/repartition.md)

        repartition_runtime.install(self.broker, adoption_timeout_ms=cfg.repartition_adoption_timeout_ms)
        await self.broker.start()
        await self._bootstrap_namespaces(cfg)
        if cfg.cluster:  # before the ports listen: no lookup is ever answered as a standalone broker
            self._build_cluster_node(cfg)
        self._start_load_reporter(cfg)

        # Security (docs/security.md): TLS on both ports, and with JWT or mTLS the guard in front of
        # every handler registered on the client port (and the admin port's interceptor).
        from danube.server.auth.runtime import Security

        self.security = Security(cfg.auth, self.broker, self.metadata)
        await self.security.start()
        self.server = self.security.guard_client_server(
            self._client_server(cfg.grpc_server, cfg.http2, self.metrics.rpc)
        )
        # The schema registry first: it hands Danube's protocol and the batch lane the gate.
        schema_service = _optional_edge("danube.server.schema_service")
        if schema_service is not None:
            self.schema_gate = await schema_service.attach(
                self.server, self.broker, self.metadata, cfg.json_schema_rule
            )
        danube_services.add_to_server(self.server, self.broker)
        batch_lane = _optional_edge("danube.server.batch_lane")
        if batch_lane is not None:
            batch_lane.add_to_server(self.server, self.broker)
        scalable = _optional_edge("danube.server.scalable_service")
        if scalable is not None:  # scalable topics (docs/scalable-topics.md)
            self.scalable = scalable.attach(self.server, self.broker, cfg.scalable_topics)
        self.bound["client"] = self._bind(self.server, cfg.port, "client")

        admin = _optional_edge("danube.server.admin")
        if cfg.admin_port:
            # counting outermost: a call the guard refuses is counted with its status too
            self.admin_server = grpc.aio.server(
                options=GRPC_OPTIONS,
                interceptors=[CountingInterceptor(self.metrics.rpc), *self.security.interceptors()],
            )
            if admin is not None:
                admin.add_to_server(self.admin_server, self.broker)
            if self.schema_gate is not None:  # Danube's admin CLI reaches the registry on the admin port
                schema_service.add_to_server(self.admin_server, self.schema_gate.registry, self.schema_gate)
            if self.scalable is not None:  # `danube admin scalable-topics` uses the admin port
                scalable.add_servicer(self.admin_server, self.scalable)
            self.security.add_admin_services(self.admin_server)
            self.bound["admin"] = self._bind(self.admin_server, cfg.admin_port, "admin")
        if cfg.metrics_port:
            self.metrics.serve(cfg.host, cfg.metrics_port)
            self.bound["metrics"] = cfg.metrics_port
            # advertised in ListBrokers so `danube admin serve` can scrape each broker (docs/gateway.md)
            self.broker.metrics_url = f"http://{self._local_host(cfg)}:{cfg.metrics_port}"

        await self.server.start()
        if self.admin_server is not None:
            await self.admin_server.start()
        if cfg.cluster:
            await self._join_cluster(cfg)
        log.info(
            "danube broker %s serving Danube clients on %s:%d (advertised %s); admin port %s; "
            "batch lane %s; data in %s; sync=%s; gRPC server %s",
            cfg.broker_id,
            cfg.host,
            self.bound["client"],
            cfg.broker_url,
            self.bound.get("admin", "off"),
            "on" if batch_lane else "not installed",
            os.path.abspath(cfg.data_dir),
            cfg.sync,
            cfg.grpc_server,
        )
        # The gRPC I/O runtime is chosen by grpc's own GRPC_EXPERIMENTS (read when grpc is
        # imported); docs/benchmarks.md measures the choice, so the log says which one ran.
        log.info(
            "grpc %s, GRPC_EXPERIMENTS=%s; %s",
            grpc.__version__,
            os.environ.get("GRPC_EXPERIMENTS") or "(grpc's defaults)",
            _allocator.described(),
        )

    async def _bootstrap_namespaces(self, cfg: BrokerConfig) -> None:
        """Danube's bootstrap_namespaces: each exists once the broker serves (a namespace is its
        policy key; an existing one keeps its policies)."""
        from danube.metadata import keys

        store = cast("MetadataStore", self.metadata)  # start() set it
        for ns in cfg.bootstrap_namespaces:
            if await store.get(keys.namespace_policy(ns)) is None:
                await store.put_json(keys.namespace_policy(ns), {})
                log.info("namespace %s created (bootstrap_namespaces)", ns)

    def _start_load_reporter(self, cfg: BrokerConfig) -> None:
        """LoadReports of this broker to /system/load_reports (docs/load-reports.md); in cluster mode
        the node's reporter does it, and also puts each report into etcd for the leader."""
        interval = cfg.load_report_interval_seconds
        if cfg.cluster or not interval or interval <= 0:
            return
        from danube.cluster.load_report import LoadReporter

        self.load_reporter = LoadReporter(cast("BrokerService", self.broker), interval)  # start() set it
        self.load_reporter.start()
        log.info("load reports every %g s to %s", interval, self.load_reporter.topic)

    @staticmethod
    def _metadata_store(cfg: BrokerConfig) -> MetadataStore:
        if not cfg.cluster:
            return EmbeddedMetadataStore(cfg.metadata_path)
        from danube.metadata.etcd import EtcdMetadataStore

        cfg.check_cluster()
        return EtcdMetadataStore(cast(str, cfg.etcd_url))  # check_cluster() refused it unset

    @staticmethod
    def _local_host(cfg: BrokerConfig) -> str:
        return "127.0.0.1" if cfg.host in ("0.0.0.0", "::", "") else cfg.host

    def _build_cluster_node(self, cfg: BrokerConfig) -> None:
        from danube.cluster.node import ClusterNode

        admin_host = self._local_host(cfg)
        broker = cast("BrokerService", self.broker)  # start() set it and the store
        self.cluster = ClusterNode(
            cast("MetadataStore", self.metadata),
            broker,
            broker_id=cfg.broker_id,
            broker_url=cfg.broker_url,
            admin_url=f"{cfg.url_scheme}://{admin_host}:{cfg.admin_port}" if cfg.admin_port else None,
            metrics_url=f"http://{admin_host}:{cfg.metrics_port}" if cfg.metrics_port else None,
            lease_ttl_s=cfg.lease_ttl_seconds,
            strategy=cfg.assignment_strategy,
            load_report_interval_s=cfg.load_report_interval_seconds,
            cluster_name=cfg.cluster_name,
            rebalancing=cfg.rebalancing,
            metrics=self.metrics,
            client_proxy=cfg.client_proxy,
        )
        broker.cluster = self.cluster

    async def _join_cluster(self, cfg: BrokerConfig) -> None:
        """Register, campaign, follow the cluster (danube.cluster.node); after the ports listen."""
        await cast("ClusterNode", self.cluster).start()  # built by start() in cluster mode
        log.info(
            "broker %s in cluster %s (etcd %s, strategy %s)",
            cfg.broker_id,
            cfg.cluster_name,
            cfg.etcd_url,
            cfg.assignment_strategy,
        )

    @staticmethod
    def _client_server(kind: str, http2: H2Limits | None = None, rpc: RpcCounts | None = None):
        if kind == "native":
            from danube.server.h2grpc import H2Server

            server = H2Server(http2 if http2 is not None else H2Limits(max_receive_message_length=MAX_MESSAGE_BYTES))
            if rpc is not None:
                server.on_status = rpc.observe
            return server
        return grpc.aio.server(
            options=GRPC_OPTIONS, interceptors=[CountingInterceptor(rpc)] if rpc is not None else None
        )

    def _bind(self, server: grpc.aio.Server, port: int, what: str) -> int:
        address = f"{self.config.host}:{port}"
        try:
            security = getattr(self, "security", None)
            bound = security.add_port(server, address) if security is not None else server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {address} ({what} port): {exc}") from exc
        if bound == 0:
            raise OSError(f"cannot listen on {address} ({what} port): address in use or not available")
        return bound

    async def stop(self) -> None:
        log.info("stopping: no new calls, finishing in-flight ones (up to %.0f s)", STOP_GRACE_S)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_S
        if self.broker is not None:
            # Open publish streams would otherwise keep storing new batches until the grace period
            # ends and then be cancelled with batches written but unacked, which clients resend
            # (duplicates).  New batches get UNAVAILABLE now; those in flight are stored and acked.
            self.broker.begin_shutdown()
            await self.broker.drain_publishes(STOP_GRACE_S)
        servers = [s for s in (self.server, self.admin_server) if s is not None]
        grace = max(0.1, deadline - loop.time())
        # The servers take no new call from here on; while their open calls (consumer streams) wind
        # down, every served topic is sealed and handed to the leader, so the clients' calls (held by
        # the brokers they came through, danube.cluster.client_proxy) resume at the new owners now
        # rather than after the grace period.
        stopping = asyncio.gather(*(s.stop(grace) for s in servers), return_exceptions=True)
        if self.cluster is not None:
            await self.cluster.leave()
        await stopping
        if self.scalable is not None:
            await self.scalable.stop()  # resigns its controller leaderships
        if self.load_reporter is not None:
            await self.load_reporter.stop()  # its last report, if one is being written, is cancelled
        if self.broker is not None:
            await self.broker.stop()
        if self.cluster is not None:
            await self.cluster.stop()  # revokes the lease last: the leader then reassigns our topics
        if self.schema_gate is not None:
            await self.schema_gate.stop()
        if getattr(self, "security", None) is not None:
            await self.security.stop()
        if self.metadata is not None:
            await self.metadata.close()
        log.info("stopped cleanly")


async def serve(
    config: BrokerConfig,
    *,
    on_ready: Callable[[BrokerApp], None] | None = None,
    stop_event: asyncio.Event | None = None,
) -> int:
    """Run the broker until SIGTERM/SIGINT (or ``stop_event``); return the exit code."""
    app = BrokerApp(config)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (in-process use): the caller sets stop_event
    try:
        try:
            await app.start()
        except BaseException:
            await app.stop()
            raise
        if on_ready is not None:
            on_ready(app)
        await stop.wait()
        log.info("shutdown requested")
        await app.stop()
        return 0
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


# GIL switch interval of the broker process.  The WAL's sync thread needs the GIL for a moment
# after each fdatasync to answer its waiters; with the default 5 ms a busy event loop keeps it
# waiting up to 5 ms per sync, which showed up directly in publish latency (docs/benchmarks.md).
GIL_SWITCH_INTERVAL_S = 0.0005


def run(config: BrokerConfig) -> int:
    """Blocking entry point: a uvloop event loop running :func:`serve`."""
    import sys

    import uvloop

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    _allocator.tune()
    _gctune.tune()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        # once started, the startup heap (modules, config, stores) leaves the collector's sight
        return runner.run(serve(config, on_ready=lambda _app: _gctune.freeze()))
