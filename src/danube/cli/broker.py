"""`danube broker`: run a standalone broker (embedded metadata, local WAL storage)."""

from __future__ import annotations

import dataclasses
import logging

from danube.errors import DanubeError

log = logging.getLogger("danube.broker")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "broker",
        help="run a standalone broker",
        description=(
            "Run a standalone Danube-compatible broker: Danube clients connect to the client port, "
            "the admin service listens on the admin port, Prometheus metrics on the metrics port. "
            "Metadata is embedded (sqlite) and reliable topics are stored in a write-ahead log under "
            "the data directory. Flags override the config file. SIGTERM or Ctrl-C stops it cleanly."
        ),
    )
    p.add_argument("--config", metavar="FILE", help="danube_broker.yml (Danube's key names; see docs/broker.md)")
    p.add_argument("--host", default=None, help="address to listen on [default 127.0.0.1]")
    p.add_argument("--port", type=int, default=None, help="client port for Danube's protocol [default 6650]")
    p.add_argument("--admin-port", type=int, default=None, help="admin gRPC port, 0 = off [default 50051]")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus port, 0 = off [default 9040]")
    p.add_argument("--data-dir", default=None, help="where WALs and metadata live [default ./danube-data]")
    p.add_argument(
        "--sync",
        choices=["always", "interval", "never"],
        default=None,
        help="when appends reach disk before a producer is answered: always = fdatasync per "
        "group commit, interval = every few ms, never = leave it to the OS [default always]",
    )
    p.add_argument(
        "--grpc-server",
        choices=["native", "grpcio", "h2"],
        default=None,
        help="what serves gRPC on the client port: native = danube's own HTTP/2 server on the "
        "broker's event loop (under a quarter of grpc.aio's CPU per unary call; h2 is its "
        "former name), grpcio = grpc.aio, its C core on threads of its own (docs/broker.md) "
        "[default native]",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="client connections the native server accepts at once; more are refused with "
        "GOAWAY (YAML http2.max_connections; the other limits: docs/broker.md) [default 4096]",
    )
    p.add_argument("--broker-id", default=None, help="this broker's id in metadata [default standalone]")
    p.add_argument(
        "--advertised-addr", default=None, help="host:port that topic lookups answer with [default HOST:PORT]"
    )
    p.add_argument(
        "--load-report-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="publish a LoadReport to /system/load_reports every SECONDS, 0 = off [default 30]",
    )
    sec = p.add_argument_group("security (docs/security.md; flags win over the config file's auth block)")
    sec.add_argument(
        "--tls-cert", metavar="PEM", default=None, help="server certificate: TLS on the client and admin ports"
    )
    sec.add_argument("--tls-key", metavar="PEM", default=None, help="its private key (refused when world-readable)")
    sec.add_argument("--tls-ca", metavar="PEM", default=None, help="CA that signs client certificates")
    sec.add_argument(
        "--tls-verify-client",
        action="store_true",
        default=None,
        help="mTLS: require a client certificate signed by --tls-ca",
    )
    sec.add_argument(
        "--jwt-secret-file",
        metavar="FILE",
        default=None,
        help="file holding the HS256 secret: every call then needs 'authorization: Bearer <jwt>'",
    )
    sec.add_argument("--jwt-issuer", default=None, help="issuer a token must carry [default danube-auth]")
    sec.add_argument(
        "--super-admin",
        action="append",
        default=None,
        metavar="SUBJECT",
        help="a subject that bypasses RBAC (repeatable)",
    )
    cl = p.add_argument_group(
        "cluster mode (docs/cluster.md; meta_store: {host, port} in the config file also turns it on)"
    )
    cl.add_argument(
        "--cluster",
        action="store_true",
        default=None,
        help="join a cluster: metadata in etcd, registration under a lease, leader election, "
        "topic placement by the leader's load manager",
    )
    cl.add_argument(
        "--etcd",
        metavar="URL",
        default=None,
        help="etcd endpoint(s), http://HOST:PORT[,http://HOST2:PORT2] (implies --cluster)",
    )
    cl.add_argument(
        "--advertised-url",
        metavar="URL",
        default=None,
        help="http://HOST:PORT other brokers redirect clients to [default http://HOST:PORT]",
    )
    cl.add_argument(
        "--lease-ttl",
        type=int,
        default=None,
        metavar="SECONDS",
        help="the broker's etcd lease; publishes stop after 2/3 of it without renewal [default 10]",
    )
    cl.add_argument(
        "--assignment-strategy",
        choices=["fair", "balanced", "weighted_load"],
        default=None,
        help="how the leader places topics [default fair, or load_manager.assignment_strategy]",
    )
    cl.add_argument("--cluster-name", default=None, help="cluster name [default danube, or cluster_name]")
    p.set_defaults(func=run)


def _cluster_overrides(config, args):
    """--cluster / --etcd / --advertised-url ... on top of the file; a default broker id per port."""
    overrides: dict = {}
    if getattr(args, "etcd", None):
        overrides.update(etcd_url=args.etcd, cluster=True)
    if getattr(args, "cluster", None):
        overrides["cluster"] = True
    url = getattr(args, "advertised_url", None)
    if url:
        overrides["advertised_addr"] = url.split("://", 1)[-1].rstrip("/")
    for flag, key in (
        ("lease_ttl", "lease_ttl_seconds"),
        ("assignment_strategy", "assignment_strategy"),
        ("cluster_name", "cluster_name"),
    ):
        if getattr(args, flag, None) is not None:
            overrides[key] = getattr(args, flag)
    config = config.with_overrides(**overrides)
    if config.cluster and config.broker_id == "standalone":
        config = config.with_overrides(broker_id=f"broker-{config.port}")
    if config.cluster:
        config.check_cluster()
    return config


def build_config(args):
    from danube.server.config import BrokerConfig

    config = BrokerConfig.from_yaml(args.config) if args.config else BrokerConfig()
    if getattr(args, "max_connections", None) is not None:
        config = config.with_overrides(http2=dataclasses.replace(config.http2, max_connections=args.max_connections))
    if any(
        getattr(args, f, None)
        for f in ("tls_cert", "tls_key", "tls_ca", "tls_verify_client", "jwt_secret_file", "jwt_issuer", "super_admin")
    ):
        from danube.security.settings import with_flags

        config = config.with_overrides(
            auth=with_flags(
                config.auth,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tls_ca=args.tls_ca,
                tls_verify_client=args.tls_verify_client,
                jwt_secret_file=args.jwt_secret_file,
                jwt_issuer=args.jwt_issuer,
                super_admins=args.super_admin,
            )
        )
    return config.with_overrides(
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        metrics_port=args.metrics_port,
        data_dir=args.data_dir,
        sync=args.sync,
        grpc_server=getattr(args, "grpc_server", None),
        broker_id=args.broker_id,
        advertised_addr=args.advertised_addr,
        load_report_interval_seconds=getattr(args, "load_report_interval", None),
    )


def run(args) -> int:
    from danube.server.app import run as run_app

    try:
        config = _cluster_overrides(build_config(args), args)
    except DanubeError as exc:
        log.error("bad configuration: %s", exc)
        return 2
    log.info(
        "starting broker: client %s:%d, admin %s, metrics %s, data %s, sync %s, gRPC server %s%s",
        config.host,
        config.port,
        config.admin_port or "off",
        config.metrics_port or "off",
        config.data_dir,
        config.sync,
        config.grpc_server,
        f", config {args.config}" if args.config else "",
    )
    try:
        return run_app(config)
    except OSError as exc:
        log.error("%s", exc)
        return 1
    except DanubeError as exc:
        log.error("broker failed: %s", exc)
        return 1
