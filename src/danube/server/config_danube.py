"""Danube's broker YAML (Danube 0.15) read as this broker's: each of its keys honoured, mapped onto
ours, or — when this broker cannot honour it — dropped with a warning that names it.

    meta_store: {data_dir: D}           → the embedded metadata store lives in D (Danube: its Raft log)
    meta_store: {seed_nodes: [...]}     → warning: no Raft here; a cluster runs on etcd (host, port)
    broker.ports.prometheus             → the metrics port (``prom`` is this project's older name)
    broker.ports.raft                   → warning: no Raft transport
    broker.advertised_listeners         → broker_url: what lookups answer; connect_url: warning
    admin_tls                           → warning when it differs from what the admin port does
    storage.wal.rotation.max_bytes      → storage.wal.max_file_mb
    storage.wal.rotation.max_hours      → storage.wal.max_file_age_seconds
    storage.wal.advanced.*              → warning (this WAL's cache and sync have their own keys)
    storage.write_buffer                → warning: no Valkey write buffer
    storage.durable.{profile, role_arn, session_token, anonymous, virtual_host_style} → warning

``bootstrap_namespaces`` and ``auto_create_topics`` are BrokerConfig fields (created at start;
honoured by producers); the rest of Danube's keys are this broker's own already.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from danube.errors import InvalidArgumentError

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_S3_EXTRAS = ("profile", "role_arn", "session_token", "anonymous", "virtual_host_style")


def _warn(key: str, why: str) -> None:
    log.warning("config key %s is not honoured by this broker: %s", key, why)


def _section(doc: Mapping[str, Any], key: str, where: str) -> dict:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{where}: expected a mapping, got {value!r}")
    return dict(value)


def translate(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with Danube's keys replaced by this broker's (a new dict; ``data`` is untouched).

    The results land under keys :meth:`BrokerConfig.from_dict` reads: ``metadata_dir``,
    ``broker.ports.prom``, ``broker.advertised_addr`` and the storage section's own WAL keys."""
    out = dict(data)
    broker = _section(out, "broker", "broker")
    if broker:
        ports = _section(broker, "ports", "broker.ports")
        if "prometheus" in ports:
            ports.setdefault("prom", ports.pop("prometheus"))
        if "raft" in ports:
            ports.pop("raft")
            _warn(
                "broker.ports.raft",
                "there is no Raft transport; brokers of a cluster share etcd (meta_store: {host, port})",
            )
        if ports:
            broker["ports"] = ports
        listeners = _section(broker, "advertised_listeners", "broker.advertised_listeners")
        broker.pop("advertised_listeners", None)
        if listeners.get("broker_url"):
            broker.setdefault("advertised_addr", str(listeners["broker_url"]))
        if listeners.get("connect_url") and listeners.get("connect_url") != listeners.get("broker_url"):
            _warn("broker.advertised_listeners.connect_url", "there is no gRPC proxy mode; lookups answer broker_url")
        out["broker"] = broker
    meta = out.get("meta_store")
    if isinstance(meta, Mapping) and ("data_dir" in meta or "seed_nodes" in meta):
        meta = dict(meta)
        if "data_dir" in meta:
            out["metadata_dir"] = str(meta.pop("data_dir"))
        if meta.pop("seed_nodes", None):
            _warn(
                "meta_store.seed_nodes",
                "there is no embedded Raft group; a cluster runs on etcd (meta_store: {host, port} or --etcd)",
            )
        if meta and not {"host", "port"} <= set(meta):
            raise InvalidArgumentError(
                f"meta_store: unknown key(s) {', '.join(sorted(map(str, meta)))}; "
                f"expected data_dir (embedded) or host and port (etcd)"
            )
        if meta:
            out["meta_store"] = meta
        else:
            out.pop("meta_store")
    if "storage" in out and isinstance(out["storage"], Mapping):
        out["storage"] = _storage(dict(out["storage"]))
    return out


def admin_tls_warning(admin_tls: Any, tls_enabled: bool) -> None:
    """Danube's ``admin_tls`` switches TLS on the admin port alone; here the admin port speaks TLS
    exactly when ``auth.tls`` is set (docs/security.md)."""
    if not isinstance(admin_tls, bool):
        raise InvalidArgumentError(f"admin_tls must be true or false, got {admin_tls!r}")
    if admin_tls and not tls_enabled:
        _warn("admin_tls", "the admin port speaks TLS only with auth.tls (cert_file, key_file) set")
    elif not admin_tls and tls_enabled:
        _warn("admin_tls", "with auth.tls set the admin port speaks TLS too")


def _storage(storage: dict) -> dict:
    wal = _section(storage, "wal", "storage.wal")
    rotation = _section(wal, "rotation", "storage.wal.rotation")
    wal.pop("rotation", None)
    if "max_bytes" in rotation:
        size = rotation.pop("max_bytes")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError(
                f"storage.wal.rotation.max_bytes: expected a positive number of bytes, got {size!r}"
            )
        wal.setdefault("max_file_mb", size / _MIB)
    if rotation.get("max_hours") is not None:
        hours = rotation.pop("max_hours")
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or hours <= 0:
            raise InvalidArgumentError(f"storage.wal.rotation.max_hours: expected a positive number, got {hours!r}")
        wal.setdefault("max_file_age_seconds", float(hours) * 3600)
    rotation.pop("max_hours", None)
    for key in sorted(rotation):
        _warn(f"storage.wal.rotation.{key}", "unknown to this WAL (it rotates by max_bytes and max_hours)")
    advanced = wal.pop("advanced", None)
    if isinstance(advanced, Mapping):
        for key in sorted(advanced):
            _warn(
                f"storage.wal.advanced.{key}",
                "this WAL sizes its cache with storage.wal.cache_mb and syncs "
                "by the broker's sync setting (always | interval | never)",
            )
    if wal or "wal" in storage:
        storage["wal"] = wal
    if storage.pop("write_buffer", None) is not None:
        _warn(
            "storage.write_buffer",
            "there is no Valkey write buffer; a reliable topic is durable on the "
            "broker's own WAL (sync) and its exported segments",
        )
    durable = storage.get("durable")
    if isinstance(durable, Mapping):
        durable = dict(durable)
        for key in _S3_EXTRAS:
            if key in durable:
                durable.pop(key)
                _warn(
                    f"storage.durable.{key}",
                    "the S3 backend takes endpoint, region, access_key and "
                    "secret_key (else the AWS default credential chain)",
                )
        storage["durable"] = durable
    return storage
