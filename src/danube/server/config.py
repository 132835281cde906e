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
    storage:                        # danube.storage.config.StorageConfig (docs/storage.md)
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

Every section is a frozen dataclass loaded by the one loader, ``danube.settings.load_section``:
a wrong key or value is a :class:`~danube.settings.ConfigError` whose sentence names its key path
(``http2.max_frame_size: expected an integer in 16384..16777215, got 100``).  docs/broker.md,
"Every setting", lists them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import yaml

from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.cluster.rebalancing.config import RebalancingConfig
from danube.cluster.scoring import STRATEGIES
from danube.errors import InvalidArgumentError
from danube.metadata import keys
from danube.routing.repartition.model import DEFAULT_ADOPTION_TIMEOUT_MS
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.schema.compat import JSON_SCHEMA_RULES, normalize_json_schema_rule
from danube.security.settings import AuthSettings, refuse_if_world_readable
from danube.server import config_danube
from danube.server.h2grpc.limits import H2Limits
from danube.settings import ConfigError, check_settings, check_value, load_fields, load_section, setting
from danube.storage.config import StorageConfig

log = logging.getLogger(__name__)

SYNC_MODES = ("always", "interval", "never")
GRPC_SERVERS = ("native", "grpcio")
# Former names still accepted in files and flags: `h2` named the native server after the h2
# library it was first built on, which it no longer uses.
GRPC_SERVER_ALIASES = {"h2": "native"}
_DANUBE_IGNORED = {"schema_registry", "proxy", "raft", "cluster"}
# Keys whose values are secrets: a config file holding one must not be readable by everyone.
_SECRET_KEYS = {"secret_key", "secret_access_key", "access_key", "password", "token"}
_PORT_RANGE = {"minimum": 0, "maximum": 65535}


def _port(default: int | None) -> Any:
    return setting(default, minimum=0, maximum=65535)


@dataclass(frozen=True)
class PortsSection:
    """``broker.ports`` (Danube's ``prometheus`` is read as ``prom``; ``raft`` is a warning)."""

    client: int | None = _port(None)
    admin: int | None = _port(None)
    prom: int | None = _port(None)


@dataclass(frozen=True)
class BrokerSection:
    """The ``broker:`` block of the file (Danube's layout)."""

    host: str | None = None
    advertised_addr: str | None = None  # Danube's advertised_listeners.broker_url lands here
    ports: PortsSection = field(default_factory=PortsSection)


@dataclass(frozen=True)
class LoadManagerSection:
    """``load_manager`` keys this broker honours; Danube's others are warnings."""

    assignment_strategy: str | None = setting(None, choices=STRATEGIES)
    load_report_interval_seconds: float | None = setting(None, minimum=0)
    rebalancing: Any = None  # loaded with the strategy beside it (RebalancingConfig)


@dataclass(frozen=True)
class EtcdSection:
    """``meta_store: {host, port}``: etcd, which turns cluster mode on."""

    host: str | None = None
    port: int | None = _port(None)


@dataclass(frozen=True)
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = _port(6650)
    admin_port: int = _port(50051)  # 0 turns the admin port off
    metrics_port: int = _port(9040)  # 0 disables the metrics endpoint
    data_dir: str = "./danube-data"
    sync: str = setting("always", choices=SYNC_MODES)  # the WAL's storage.wal.sync
    # which gRPC server serves the client port (docs/broker.md)
    grpc_server: str = setting("native", choices=GRPC_SERVERS, aliases=GRPC_SERVER_ALIASES)
    broker_id: str = "standalone"
    advertised_addr: str | None = None
    policies: TopicPolicies = field(default_factory=TopicPolicies)
    failure_policy: FailurePolicy = field(default_factory=FailurePolicy)
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    # the ``storage:`` section; paths left to their defaults follow data_dir (storage_config())
    storage: StorageConfig = field(default_factory=StorageConfig)
    # cluster mode (docs/cluster.md): etcd metadata, registration, leader, load manager
    cluster: bool = setting(False, in_file=False)  # meta_store: {host, port} or --etcd
    etcd_url: str | None = setting(None, in_file=False)  # from meta_store {host, port} or --etcd
    cluster_name: str = "danube"
    # the broker's etcd lease; it is fenced after 2/3 of it
    lease_ttl_seconds: int = setting(10, minimum=2)
    # Danube's proxy mode: a lookup of a topic owned elsewhere names this broker as connect_url and it
    # forwards Danube's calls to the owner, holding them through moves and failures (docs/cluster.md)
    client_proxy: bool = True
    # load_manager.assignment_strategy
    assignment_strategy: str = setting("fair", choices=STRATEGIES, in_file=False)
    # load_manager.rebalancing (docs/rebalancing.md); None when the file has no such block (disabled)
    rebalancing: RebalancingConfig | None = setting(None, in_file=False)
    # The native server's HTTP/2 limits (``http2:``; docs/broker.md, "The gRPC server on the client port").
    http2: H2Limits = field(default_factory=H2Limits)
    # Danube's load_manager key (a top-level key is read too); 0 = no load reports
    load_report_interval_seconds: float = setting(30.0, minimum=0)
    # ``scalable_topics:`` (docs/scalable-topics.md); None when the file has none (the defaults)
    scalable_topics: ScalableTopicsConfig | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)  # Danube's auth block (docs/security.md)
    metadata_dir: str | None = None  # Danube's meta_store.data_dir; default: data_dir
    bootstrap_namespaces: tuple[str, ...] = ()  # created at start when missing
    auto_create_topics: bool = True  # false: a producer cannot create a topic (admin create only)
    # JSON Schema compatibility: danube (Danube's checker) | reader_writer (stricter; docs/schema-registry.md)
    json_schema_rule: str = setting("danube", choices=JSON_SCHEMA_RULES)
    # live repartition: how long a cutover waits for every broker and client to adopt the new
    # partitioning before the old partitions are drained anyway (docs/repartition.md)
    repartition_adoption_timeout_ms: int = setting(DEFAULT_ADOPTION_TIMEOUT_MS, minimum=1)

    def __post_init__(self) -> None:
        check_settings(self)
        roles = {"client": self.port, "admin": self.admin_port, "metrics": self.metrics_port}
        taken: dict[int, str] = {}
        for role, value in roles.items():
            if value and value in taken:  # 0 turns the admin or metrics listener off
                raise ConfigError(
                    f"port {value} is given as both the {taken[value]} and the {role} port; each needs its own"
                )
            taken[value] = role

    def check_cluster(self) -> None:
        """Cluster settings that only matter when ``cluster`` is on."""
        if self.cluster and not self.etcd_url:
            raise ConfigError("cluster mode needs etcd: --etcd http://HOST:PORT or meta_store: {host, port}")

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

    def storage_config(self) -> StorageConfig:
        """The ``storage:`` section under this broker's data directory, with its sync policy."""
        return self.storage.with_data_dir(self.data_dir).with_sync(self.sync)

    # ------------------------------------------------------------ loading

    @classmethod
    def from_yaml(cls, path: str) -> "BrokerConfig":
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
        """The whole file's mapping; relative paths in it are resolved against ``base_dir``."""
        return load_section(cls, data, "", base_dir=base_dir)

    @classmethod
    def parse_section(cls, data: Mapping[str, Any], path: str = "", *, base_dir: str | None = None) -> "BrokerConfig":
        """The loader's hook: the file's layout (Danube's: ``broker.ports``, ``meta_store``,
        ``load_manager``) onto the fields; every key is checked by the one loader."""
        data = config_danube.translate(data)
        kw: dict[str, Any] = {}
        broker_section = load_section(BrokerSection, data.pop("broker", None), "broker")
        for name in ("host", "advertised_addr"):
            if getattr(broker_section, name) is not None:
                kw[name] = getattr(broker_section, name)
        for src, dst in (("client", "port"), ("admin", "admin_port"), ("prom", "metrics_port")):
            if getattr(broker_section.ports, src) is not None:
                kw[dst] = getattr(broker_section.ports, src)
        for key, dst in (("broker_addr", "port"), ("admin_addr", "admin_port"), ("prom_exporter", "metrics_port")):
            if key in data:  # Danube's older flat keys
                host, port = _addr(data.pop(key), key)
                kw[dst] = port
                if key == "broker_addr" and host:
                    kw["host"] = host
        admin_tls = data.pop("admin_tls", None)
        storage = data.pop("storage", None)
        auth = data.pop("auth", None)
        load_manager = data.pop("load_manager", None)
        meta_store = data.pop("meta_store", None)
        if isinstance(data.get("json_schema_rule"), str):  # "Reader-Writer" spells reader_writer too
            with contextlib.suppress(InvalidArgumentError):  # else the loader names the choices
                data["json_schema_rule"] = normalize_json_schema_rule(data["json_schema_rule"])
        for key in sorted(k for k in data if k in _DANUBE_IGNORED):
            data.pop(key)
            log.warning("config key %s is not honoured by this broker", key)
        kw.update(load_fields(cls, data, ""))
        if "data_dir" in kw and base_dir is not None and not os.path.isabs(kw["data_dir"]):
            kw["data_dir"] = os.path.join(base_dir, kw["data_dir"])
        # (metadata_dir stays relative to the working directory, as Danube reads meta_store.data_dir
        # and storage.local_wal_root beside it)
        if "bootstrap_namespaces" in kw:
            kw["bootstrap_namespaces"] = _namespaces(kw["bootstrap_namespaces"])
        if auth is not None:
            kw["auth"] = AuthSettings.from_dict(auth, base_dir=base_dir)
        if admin_tls is not None:
            config_danube.admin_tls_warning(admin_tls, kw.get("auth", AuthSettings()).tls_enabled)
        if storage is not None:
            kw["storage"] = StorageConfig.from_dict(storage, data_dir=kw.get("data_dir", cls.data_dir))
            sync = _one_sync(storage, kw.get("sync"))
            if sync is not None:
                kw["sync"] = sync
        kw.update(_load_manager(load_manager))
        if meta_store is not None:  # etcd's {host, port} (Danube before its embedded Raft store): cluster mode
            etcd = load_section(EtcdSection, meta_store, "meta_store")
            if etcd.host is None or etcd.port is None:
                raise ConfigError("meta_store", "expected {host: ..., port: ...} (etcd)")
            kw["etcd_url"] = f"http://{etcd.host}:{etcd.port}"
            kw["cluster"] = True
        return cls(**kw)

    def with_overrides(self, **overrides: Any) -> "BrokerConfig":
        """Flags on top of the file: ``None`` means "not given"."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _load_manager(section: Any) -> dict[str, Any]:
    """``load_manager``: the keys this broker honours; Danube's others are warnings."""
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError("load_manager", f"expected a mapping of settings, got {section!r}")
    section = dict(section)
    known = {
        k: section.pop(k)
        for k in ("assignment_strategy", "load_report_interval_seconds", "rebalancing")
        if k in section
    }
    for key in sorted(map(str, section)):
        log.warning("config key load_manager.%s is not honoured by this broker", key)
    values = load_fields(LoadManagerSection, known, "load_manager")
    out: dict[str, Any] = {}
    if values.get("assignment_strategy") is not None:
        out["assignment_strategy"] = values["assignment_strategy"]
    if values.get("load_report_interval_seconds") is not None:
        out["load_report_interval_seconds"] = values["load_report_interval_seconds"]
    if "rebalancing" in known:
        strategy = out.get("assignment_strategy", BrokerConfig.assignment_strategy)
        out["rebalancing"] = RebalancingConfig.from_dict(known["rebalancing"], strategy=strategy)
    return out


def _one_sync(storage: Any, sync: str | None) -> str | None:
    """The WAL's sync policy is one setting: top-level ``sync`` or ``storage.wal.sync``."""
    wal = storage.get("wal") if isinstance(storage, Mapping) else None
    in_storage = wal.get("sync") if isinstance(wal, Mapping) else None
    if in_storage is None:
        return sync
    if sync is not None and sync != in_storage:
        raise ConfigError(
            "storage.wal.sync", f"{in_storage!r} differs from sync {sync!r}; they are one setting, give one"
        )
    return in_storage


def _holds_secrets(doc: Any) -> bool:
    if isinstance(doc, Mapping):
        return any((str(k) in _SECRET_KEYS and v not in (None, "")) or _holds_secrets(v) for k, v in doc.items())
    if isinstance(doc, list):
        return any(_holds_secrets(v) for v in doc)
    return False


def _namespaces(value: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for i, name in enumerate(value):
        try:
            out.append(keys.check_namespace(name.strip("/")))
        except InvalidArgumentError as exc:
            raise ConfigError(f"bootstrap_namespaces[{i}]", str(exc)) from None
    return tuple(out)


def _addr(value: Any, where: str) -> tuple[str | None, int]:
    text = str(value)
    for prefix in ("http://", "https://"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(where, f"expected host:port, got {value!r}")
    return (host or None), check_value(int(port), int, _PORT_RANGE, where)
