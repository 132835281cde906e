"""BrokerConfig: defaults, the YAML file (Danube's key names where they exist), flags on top.

Example ``danube_broker.yml``::

    cluster_name: standalone
    broker_id: broker-1             # default: "standalone"
    broker:
      host: 127.0.0.1
      advertised_addr: 127.0.0.1:6650  # what lookups answer (default host:port)
      ports: {client: 6650, admin: 50051, prom: 9040}
    # or Danube's older flat keys: broker_addr: "127.0.0.1:6650", admin_addr, prom_exporter
    data_dir: ./danube-data
    sync: always                    # always | interval | never (storage.wal.sync)
    grpc_server: native             # native (danube's own server on the event loop; alias h2) | grpcio (grpc.aio)
    http2:                          # limits of the native server (H2Limits fields, docs/broker.md)
      max_connections: 4096         # (flag --max-connections); the other limits keep their defaults
    policies:                       # Danube's topic policies, 0 = unlimited
      max_producers_per_topic: 0
      max_subscriptions_per_topic: 0
      max_consumers_per_topic: 0
      max_consumers_per_subscription: 0
      max_message_size: 10485760
    failure_policy:                 # default subscription failure policy
      max_redelivery_count: 5
      ack_timeout_ms: 30000
      base_redelivery_delay_ms: 1000
      max_redelivery_delay_ms: 60000
      poison_policy: block          # block | drop | dead_letter (+ dead_letter_topic)
      backoff_strategy: exponential # fixed | exponential
    json_schema_rule: danube        # JSON Schema compatibility: danube | reader_writer (stricter)
    repartition_adoption_timeout_ms: 30000   # live repartition: how long a cutover waits for adoption
    dispatch:
      max_unacked_messages: 10000
      cursor_flush_interval_ms: 1000
    storage:                        # passed to danube.storage.StorageConfig.from_dict
      mode: local
    load_manager:
      load_report_interval_seconds: 30   # LoadReport to /system/load_reports; 0 = off
    # (a top-level load_report_interval_seconds is accepted too)

``meta_store: {host, port}`` (etcd) turns cluster mode on; Danube's ``meta_store: {data_dir}``
puts the embedded metadata store in that directory.  ``bootstrap_namespaces`` are created at
start; ``auto_create_topics: false`` refuses producers on a topic nobody created.  Danube's file
loads unchanged: its keys are honoured or mapped (danube.server.config_danube), and a key this
broker cannot honour is a warning naming it; a key neither project knows is an error.  The
``auth`` block: danube.security.settings (docs/security.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.errors import InvalidArgumentError
from danube.security.settings import AuthSettings, refuse_if_world_readable

log = logging.getLogger(__name__)

SYNC_MODES = ("always", "interval", "never")
GRPC_SERVERS = ("native", "grpcio")
# Former names still accepted in files and flags: `h2` named the native server after the h2
# library it was first built on, which it no longer uses.
GRPC_SERVER_ALIASES = {"h2": "native"}
_DANUBE_IGNORED = {"schema_registry", "proxy", "raft", "cluster"}
# Keys whose values are secrets: a config file holding one must not be readable by everyone.
_SECRET_KEYS = {"secret_key", "secret_access_key", "access_key", "password", "token"}


@dataclass(frozen=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 6650
    admin_port: int = 50051
    metrics_port: int = 9040  # 0 disables the metrics endpoint
    data_dir: str = "./danube-data"
    sync: str = "always"
    grpc_server: str = "native"  # which gRPC server serves the client port (docs/broker.md)
    broker_id: str = "standalone"
    advertised_addr: str | None = None
    policies: TopicPolicies = field(default_factory=TopicPolicies)
    failure_policy: FailurePolicy = field(default_factory=FailurePolicy)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    storage: Mapping[str, Any] = field(default_factory=dict)
    # cluster mode (docs/cluster.md): etcd metadata, registration, leader, load manager
    cluster: bool = False
    etcd_url: str | None = None  # Danube's meta_store {host, port} or --etcd
    cluster_name: str = "danube"
    lease_ttl_seconds: int = 10  # the broker's etcd lease; it is fenced after 2/3 of it
    # Danube's proxy mode: a lookup of a topic owned elsewhere names this broker as connect_url and it
    # forwards Danube's calls to the owner, holding them through moves and failures (docs/cluster.md)
    client_proxy: bool = True
    assignment_strategy: str = "fair"  # load_manager.assignment_strategy: fair | balanced | weighted_load
    # load_manager.rebalancing: a danube.cluster.rebalancing.RebalancingConfig, checked at load
    # (docs/rebalancing.md); None when the file has no such block (the defaults: disabled)
    rebalancing: Any = None
    # The native server's HTTP/2 limits (YAML section ``http2:``): H2Limits field names -> values,
    # the rest keep their defaults (docs/broker.md, "The gRPC server on the client port").
    http2_limits: Mapping[str, Any] = field(default_factory=dict)
    load_report_interval_seconds: float = 30.0  # Danube's load_manager key; 0 = no load reports
    # section ``scalable_topics:``: a danube.routing.scalable.config.ScalableTopicsConfig
    # (docs/scalable-topics.md); None when the file has none (the defaults)
    scalable_topics: Any = None
    auth: AuthSettings = field(default_factory=AuthSettings)  # Danube's auth block (docs/security.md)
    metadata_dir: str | None = None  # Danube's meta_store.data_dir; default: data_dir
    bootstrap_namespaces: tuple[str, ...] = ()  # created at start when missing
    auto_create_topics: bool = True  # false: a producer cannot create a topic (admin create only)
    # JSON Schema compatibility: danube (Danube's checker) | reader_writer (stricter; docs/schema-registry.md)
    json_schema_rule: str = "danube"
    # live repartition: how long a cutover waits for every broker and client to adopt the new
    # partitioning before the old partitions are drained anyway (docs/repartition.md); None = the default
    repartition_adoption_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if self.sync not in SYNC_MODES:
            raise InvalidArgumentError(f"sync must be one of {', '.join(SYNC_MODES)}, got {self.sync!r}")
        if self.grpc_server in GRPC_SERVER_ALIASES:
            object.__setattr__(self, "grpc_server", GRPC_SERVER_ALIASES[self.grpc_server])
        if self.grpc_server not in GRPC_SERVERS:
            raise InvalidArgumentError(
                f"grpc_server must be one of {', '.join(GRPC_SERVERS)}, got {self.grpc_server!r}"
            )
        if self.http2_limits:
            from danube.server.h2grpc.limits import H2Limits

            try:
                H2Limits.from_dict(self.http2_limits)
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"http2: {exc}") from None
        interval = self.load_report_interval_seconds
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 <= interval < float("inf"):
            raise InvalidArgumentError(
                f"load_report_interval_seconds must be a number of seconds >= 0 (0 = off), got {interval!r}"
            )
        for name in ("port", "admin_port", "metrics_port"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value <= 65535:
                raise InvalidArgumentError(f"{name} must be a port number 0-65535, got {value!r}")
        roles = {"client": self.port, "admin": self.admin_port, "metrics": self.metrics_port}
        taken: dict[int, str] = {}
        for role, value in roles.items():
            if value and value in taken:  # 0 turns the admin or metrics listener off
                raise InvalidArgumentError(
                    f"port {value} is given as both the {taken[value]} and the {role} port; each needs its own"
                )
            taken[value] = role

    def check_cluster(self) -> None:
        """Cluster settings that only matter when ``cluster`` is on."""
        from danube.cluster.scoring import STRATEGIES

        if self.assignment_strategy not in STRATEGIES:
            raise InvalidArgumentError(
                f"load_manager.assignment_strategy must be one of {', '.join(STRATEGIES)}, "
                f"got {self.assignment_strategy!r}"
            )
        if not isinstance(self.lease_ttl_seconds, int) or self.lease_ttl_seconds < 2:
            raise InvalidArgumentError(f"lease_ttl_seconds must be an integer >= 2, got {self.lease_ttl_seconds!r}")
        if self.cluster and not self.etcd_url:
            raise InvalidArgumentError("cluster mode needs etcd: --etcd http://HOST:PORT or meta_store: {host, port}")

    @property
    def url_scheme(self) -> str:
        """``https`` when the ports speak TLS: the URLs lookups and redirects hand out say so, and
        clients that choose TLS by the scheme (Danube's Rust client) follow them securely."""
        return "https" if self.auth.tls_enabled else "http"

    @property
    def broker_url(self) -> str:
        if self.advertised_addr:
            return f"{self.url_scheme}://{self.advertised_addr.split('://', 1)[-1]}"
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{self.url_scheme}://{host}:{self.port}"

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.metadata_dir or self.data_dir, "metadata.db")

    def storage_section(self) -> dict[str, Any]:
        """The ``storage:`` section with the broker's sync policy applied to the WAL."""
        section = dict(self.storage or {})
        wal = dict(section.get("wal") or {})
        wal["sync"] = self.sync
        section["wal"] = wal
        return section

    # ------------------------------------------------------------ loading

    @classmethod
    def from_yaml(cls, path: str) -> "BrokerConfig":
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        except OSError as exc:
            raise InvalidArgumentError(f"cannot read config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise InvalidArgumentError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"config file {path} must hold a mapping at the top level")
        if _holds_secrets(data):
            refuse_if_world_readable(path, "config file")
        return cls.from_dict(data, base_dir=os.path.dirname(os.path.abspath(path)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, base_dir: str | None = None) -> "BrokerConfig":
        from danube.server import config_danube

        data = config_danube.translate(data)
        kw: dict[str, Any] = {}
        broker = data.pop("broker", None) or {}
        if not isinstance(broker, Mapping):
            raise InvalidArgumentError("broker: expected a mapping")
        if "host" in broker:
            kw["host"] = str(broker["host"])
        if "advertised_addr" in broker:
            kw["advertised_addr"] = str(broker["advertised_addr"])
        ports = broker.get("ports") or {}
        for src, dst in (("client", "port"), ("admin", "admin_port"), ("prom", "metrics_port")):
            if src in ports:
                kw[dst] = _port(ports[src], f"broker.ports.{src}")
        for key, dst in (("broker_addr", "port"), ("admin_addr", "admin_port"), ("prom_exporter", "metrics_port")):
            if key in data:
                host, port = _addr(data.pop(key), key)
                kw[dst] = port
                if key == "broker_addr" and host:
                    kw["host"] = host
        for key in ("host", "broker_id", "advertised_addr"):
            if key in data:
                kw[key] = str(data.pop(key))
        for key in ("port", "admin_port", "metrics_port"):
            if key in data:
                kw[key] = _port(data.pop(key), key)
        if "data_dir" in data:
            d = str(data.pop("data_dir"))
            kw["data_dir"] = d if os.path.isabs(d) or base_dir is None else os.path.join(base_dir, d)
        if "metadata_dir" in data:  # as Danube reads meta_store.data_dir: relative to the working directory,
            kw["metadata_dir"] = str(data.pop("metadata_dir"))  # like storage.local_wal_root beside it
        if "bootstrap_namespaces" in data:
            kw["bootstrap_namespaces"] = _namespaces(data.pop("bootstrap_namespaces"))
        if "auto_create_topics" in data:
            value = data.pop("auto_create_topics")
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"auto_create_topics must be true or false, got {value!r}")
            kw["auto_create_topics"] = value
        if "sync" in data:
            kw["sync"] = str(data.pop("sync"))
        if "grpc_server" in data:
            kw["grpc_server"] = str(data.pop("grpc_server"))
        if "http2" in data:
            http2 = data.pop("http2") or {}
            if not isinstance(http2, Mapping):
                raise InvalidArgumentError("http2: expected a mapping of limit names to values")
            kw["http2_limits"] = dict(http2)
        if "policies" in data:
            kw["policies"] = TopicPolicies.from_dict(data.pop("policies"))
        if "failure_policy" in data:
            kw["failure_policy"] = FailurePolicy.from_dict(data.pop("failure_policy"))
        if "dispatch" in data:
            kw["dispatch"] = DispatchSettings.from_dict(data.pop("dispatch"))
        if "json_schema_rule" in data:
            from danube.schema.compat import normalize_json_schema_rule

            kw["json_schema_rule"] = normalize_json_schema_rule(str(data.pop("json_schema_rule")))
        if "repartition_adoption_timeout_ms" in data:
            value = data.pop("repartition_adoption_timeout_ms")
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(
                    f"repartition_adoption_timeout_ms must be a number of milliseconds > 0, got {value!r}"
                )
            kw["repartition_adoption_timeout_ms"] = value
        if "auth" in data:
            kw["auth"] = AuthSettings.from_dict(data.pop("auth"), base_dir=base_dir)
        if "admin_tls" in data:
            config_danube.admin_tls_warning(data.pop("admin_tls"), kw.get("auth", AuthSettings()).tls_enabled)
        if "storage" in data:
            storage = data.pop("storage") or {}
            if not isinstance(storage, Mapping):
                raise InvalidArgumentError("storage: expected a mapping")
            kw["storage"] = dict(storage)
        load_manager = data.pop("load_manager", None) or {}
        if not isinstance(load_manager, Mapping):
            raise InvalidArgumentError("load_manager: expected a mapping")
        load_manager = dict(load_manager)
        if "assignment_strategy" in load_manager:
            kw["assignment_strategy"] = str(load_manager.pop("assignment_strategy"))
        if "rebalancing" in load_manager:
            from danube.cluster.rebalancing.config import RebalancingConfig

            kw["rebalancing"] = RebalancingConfig.from_section(
                load_manager.pop("rebalancing"), strategy=kw.get("assignment_strategy", cls.assignment_strategy)
            )
        if "scalable_topics" in data:
            from danube.routing.scalable.config import ScalableTopicsConfig

            kw["scalable_topics"] = ScalableTopicsConfig.from_section(data.pop("scalable_topics"))
        if "cluster_name" in data:
            kw["cluster_name"] = str(data.pop("cluster_name"))
        meta_store = data.pop("meta_store", None)
        if meta_store is not None:  # etcd's {host, port} (Danube before its embedded Raft store): cluster mode
            if not isinstance(meta_store, Mapping) or "host" not in meta_store or "port" not in meta_store:
                raise InvalidArgumentError("meta_store: expected {host: ..., port: ...} (etcd)")
            kw["etcd_url"] = f"http://{meta_store['host']}:{_port(meta_store['port'], 'meta_store.port')}"
            kw["cluster"] = True
        if "lease_ttl_seconds" in data:
            kw["lease_ttl_seconds"] = int(data.pop("lease_ttl_seconds"))
        if "client_proxy" in data:
            value = data.pop("client_proxy")
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"client_proxy must be true or false, got {value!r}")
            kw["client_proxy"] = value
        for where, section in (
            ("load_manager.load_report_interval_seconds", load_manager),
            ("load_report_interval_seconds", data),
        ):
            if "load_report_interval_seconds" in section:
                kw["load_report_interval_seconds"] = _seconds(section.pop("load_report_interval_seconds"), where)
        for key in sorted(load_manager):
            log.warning("config key load_manager.%s is not honoured by this broker", key)
        unknown = sorted(k for k in data if k not in _DANUBE_IGNORED)
        if unknown:
            raise InvalidArgumentError(f"unknown config key(s): {', '.join(unknown)}")
        for key in sorted(data):
            log.warning("config key %s is not honoured by this broker", key)
        return cls(**kw)

    def with_overrides(self, **overrides: Any) -> "BrokerConfig":
        """Flags on top of the file: ``None`` means "not given"."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _holds_secrets(doc: Any) -> bool:
    if isinstance(doc, Mapping):
        return any((str(k) in _SECRET_KEYS and v not in (None, "")) or _holds_secrets(v) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_holds_secrets(v) for v in doc)
    return False


def _namespaces(value: Any) -> tuple[str, ...]:
    from danube.metadata import keys

    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(f"bootstrap_namespaces: expected a list of namespace names, got {value!r}")
    return tuple(keys.check_namespace(v.strip("/")) for v in value)


def _port(value: Any, where: str) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: expected a port number, got {value!r}") from None
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"{where}: port {port} is outside 0-65535")
    return port


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{where}: expected a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: expected a number of seconds, got {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise InvalidArgumentError(f"{where}: must be >= 0 (0 = off), got {value!r}")
    return seconds


def _addr(value: Any, where: str) -> tuple[str | None, int]:
    text = str(value)
    for prefix in ("http://", "https://"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep:
        raise InvalidArgumentError(f"{where}: expected host:port, got {value!r}")
    return (host or None), _port(port, where)
