"""Storage configuration read from the broker YAML's ``storage:`` section (Danube's keys).

Example::

    storage:
      mode: object_store            # local | shared_fs | object_store
      local_wal_root: ./danube-data/wal
      metadata_prefix: ""           # keys live under <prefix>/storage/topics/...
      export_interval_seconds: 300  # background export period (shared_fs, object_store)
      local_retention:
        time_minutes: 2880
        size_mb: 20480
        check_interval_minutes: 5
      wal:                          # project extension: WAL tuning
        sync: always                # always | interval | never
        sync_interval_ms: 5
        max_file_mb: 64
        max_file_age_seconds: null
        cache_mb: 64
        page_cache_mb: 128          # newest WAL bytes kept in the OS page cache; null: the OS decides
        idle_close_seconds: 60      # an idle topic's WAL releases files, threads and cache; null: never
        initial_file_kb: 256        # disk reserved for a new WAL file; doubles ahead of the writer
      durable:
        backend: s3                 # object_store only; shared_fs uses a directory
        root: my-bucket/danube      # bucket[/prefix] (s3) or a directory (shared_fs)
        endpoint: http://127.0.0.1:9000
        region: us-east-1
        access_key: ...
        secret_key: ...

Loaded by the one settings loader (``danube.settings.load_section``; ``StorageConfig.from_dict``),
whose hook :meth:`StorageConfig.parse_section` converts the units; every bad value raises
:class:`StorageConfigError` naming the key.  Paths left to their defaults live under the broker's
data directory (:meth:`StorageConfig.with_data_dir` moves them with it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, overload

from danube.settings import ConfigError, check_settings, load_fields, load_section, setting
from danube.storage.backends import DurableBackend, FilesystemBackend, S3Backend
from danube.storage.paths import topic_dir

MODES = ("local", "shared_fs", "object_store")
SYNC_MODES = ("always", "interval", "never")
DURABLE_BACKENDS = ("s3",)
_MIB = 1024 * 1024


class StorageConfigError(ConfigError):
    """The storage section of the configuration is invalid."""


@dataclass(frozen=True)
class LocalRetention:
    time_minutes: float = setting(2880.0, minimum=0)
    size_mb: float = setting(20480.0, minimum=0)
    check_interval_minutes: float = setting(5.0, minimum=0.0001)

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def max_age_s(self) -> float:
        return self.time_minutes * 60.0

    @property
    def max_bytes(self) -> int:
        return int(self.size_mb * _MIB)

    @property
    def check_interval_s(self) -> float:
        return self.check_interval_minutes * 60.0


@dataclass(frozen=True)
class WalSettings:
    sync: str = "always"
    sync_interval_ms: int = 5
    max_file_bytes: int = 64 * _MIB
    max_file_age_s: float | None = None
    cache_bytes: int = 64 * _MIB
    page_cache_bytes: int | None = 128 * _MIB
    # a topic whose WAL saw no append or file read for this long releases its files, mappings,
    # threads and cache (``Wal.suspend``); the next use reopens them.  None: never.
    idle_close_s: float | None = 60.0
    initial_file_bytes: int = 256 * 1024  # disk reserved for a new WAL file (doubles up to max_file_bytes)
    # a sync round over several topics' WALs on one file system is one syncfs (False: each
    # topic's files are fdatasync'd; docs/wal.md, "Group commit across logs")
    syncfs: bool = True

    def open_kwargs(self) -> dict[str, Any]:
        from danube.wal.sync import default_sync_group

        return {
            "sync_group": default_sync_group(self.syncfs),
            "sync": self.sync,
            "sync_interval_ms": self.sync_interval_ms,
            "max_file_bytes": self.max_file_bytes,
            "max_file_age_s": self.max_file_age_s,
            "cache_bytes": self.cache_bytes,
            "page_cache_bytes": self.page_cache_bytes,
            "initial_file_bytes": self.initial_file_bytes,
        }


@dataclass(frozen=True)
class WalKeys:
    """``storage.wal`` as the file writes it (sizes in MiB and KiB); :meth:`settings` converts."""

    sync: str = setting("always", choices=SYNC_MODES)
    sync_interval_ms: int = setting(5, minimum=1)
    max_file_mb: float = setting(64.0, minimum=4096 / _MIB)
    max_file_age_seconds: float | None = setting(None, minimum=0.001)
    cache_mb: float = setting(64.0, minimum=0)
    page_cache_mb: float | None = setting(128.0, minimum=0)  # null: the OS decides
    idle_close_seconds: float | None = setting(60.0, minimum=0.001)  # null: never
    initial_file_kb: float = setting(256.0, minimum=4)
    syncfs: bool = True

    def settings(self) -> WalSettings:
        return WalSettings(
            sync=self.sync,
            sync_interval_ms=self.sync_interval_ms,
            max_file_bytes=int(self.max_file_mb * _MIB),
            max_file_age_s=self.max_file_age_seconds,
            cache_bytes=int(self.cache_mb * _MIB),
            page_cache_bytes=None if self.page_cache_mb is None else int(self.page_cache_mb * _MIB),
            idle_close_s=self.idle_close_seconds,
            initial_file_bytes=int(self.initial_file_kb * 1024),
            syncfs=self.syncfs,
        )


@dataclass(frozen=True)
class StorageKeys:
    """The ``storage:`` section's keys, checked by the one loader before :class:`StorageConfig` is built."""

    mode: str = setting("local", choices=MODES)
    local_wal_root: str | None = None  # default: <data_dir>/wal
    metadata_prefix: str | None = None
    local_retention: LocalRetention = field(default_factory=LocalRetention)
    durable: Any = None  # its keys depend on the mode (_durable)
    wal: WalKeys = field(default_factory=WalKeys)
    export_interval_seconds: float = setting(300.0, minimum=0.01)
    read_chunk_mb: float = setting(4.0, minimum=0.0625)


@dataclass(frozen=True)
class DurableSettings:
    backend: str  # "fs" or "s3"
    root: str  # a directory (fs) or "bucket[/prefix]" (s3)
    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None

    def redacted(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "root": self.root,
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key": "***" if self.access_key else None,
            "secret_key": "***" if self.secret_key else None,
        }


@dataclass(frozen=True)
class StorageConfig:
    mode: str = "local"
    local_wal_root: str = "./danube-data/wal"
    metadata_prefix: str = ""
    local_retention: LocalRetention = field(default_factory=LocalRetention)
    durable: DurableSettings = field(default_factory=lambda: DurableSettings("fs", "./danube-data/durable"))
    wal: WalSettings = field(default_factory=WalSettings)
    export_interval_s: float = 300.0
    read_chunk_bytes: int = 4 * _MIB  # range-read size of the tiered reader
    # the directory the defaulted paths (``derived``) were placed under
    data_dir: str = field(default="./danube-data", compare=False)
    derived: frozenset[str] = field(default=frozenset({"local_wal_root", "durable"}), compare=False, repr=False)

    def with_data_dir(self, data_dir: str) -> "StorageConfig":
        """The same settings with the paths that were left to their defaults under ``data_dir``."""
        if data_dir == self.data_dir:
            return self
        changes: dict[str, Any] = {"data_dir": data_dir}
        if "local_wal_root" in self.derived:
            changes["local_wal_root"] = os.path.join(data_dir, "wal")
        if "durable" in self.derived:
            changes["durable"] = replace(self.durable, root=os.path.join(data_dir, "durable"))
        return replace(self, **changes)

    def with_sync(self, sync: str) -> "StorageConfig":
        return self if sync == self.wal.sync else replace(self, wal=replace(self.wal, sync=sync))

    @property
    def exports_continuously(self) -> bool:
        """shared_fs and object_store export on an interval and on rotation; local exports lazily."""
        return self.mode != "local"

    def make_backend(self) -> DurableBackend:
        if self.durable.backend == "s3":
            bucket, _, prefix = self.durable.root.partition("/")
            return S3Backend(
                bucket,
                prefix,
                endpoint=self.durable.endpoint,
                region=self.durable.region,
                access_key=self.durable.access_key,
                secret_key=self.durable.secret_key,
            )
        return FilesystemBackend(self.durable.root)

    def wal_dir(self, topic: str) -> str:
        """``<local_wal_root>/<ns>/<topic>`` (root resolved), checked to lie inside the root."""
        return topic_dir(self.local_wal_root, topic)

    # ------------------------------------------------------------------ parsing

    @classmethod
    def from_dict(
        cls, section: Mapping[str, Any] | None, *, data_dir: str = "./danube-data", path: str = "storage"
    ) -> "StorageConfig":
        """The ``storage:`` section; relative defaults live under ``data_dir``."""
        if section is not None and not isinstance(section, Mapping):
            raise StorageConfigError(path, f"expected a mapping, got {type(section).__name__}")
        return load_section(cls, section, path, data_dir=data_dir)

    @classmethod
    def parse_section(
        cls, section: Mapping[str, Any], path: str = "storage", *, data_dir: str = "./danube-data"
    ) -> "StorageConfig":
        """The loader's hook: the file's units (MiB, minutes) into the fields' (bytes, seconds)."""
        try:
            keys = StorageKeys(**load_fields(StorageKeys, section, path))
        except StorageConfigError:
            raise
        except ConfigError as exc:  # one error class for the storage section, as before
            raise StorageConfigError(exc.key, exc.problem) from None
        if keys.local_wal_root == "":
            raise StorageConfigError(f"{path}.local_wal_root", "expected a non-empty string, got ''")
        prefix = (keys.metadata_prefix or "").rstrip("/")
        if prefix and not prefix.startswith("/"):
            prefix = "/" + prefix
        durable = _durable(keys.mode, keys.durable, data_dir)
        derived = {"local_wal_root"} if keys.local_wal_root is None else set()
        if keys.mode == "local" and not _mapping(keys.durable, "storage.durable").get("root"):
            derived.add("durable")
        return cls(
            data_dir=data_dir,
            derived=frozenset(derived),
            mode=keys.mode,
            local_wal_root=keys.local_wal_root or os.path.join(data_dir, "wal"),
            metadata_prefix=prefix,
            local_retention=keys.local_retention,
            durable=durable,
            wal=keys.wal.settings(),
            export_interval_s=keys.export_interval_seconds,
            read_chunk_bytes=int(keys.read_chunk_mb * _MIB),
        )


@overload
def _string(section: Mapping[str, Any], key: str, default: str, where: str = ...) -> str: ...
@overload
def _string(section: Mapping[str, Any], key: str, default: None, where: str = ...) -> str | None: ...
def _string(section: Mapping[str, Any], key: str, default: str | None, where: str = "storage.") -> str | None:
    value = section.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise StorageConfigError(f"{where}{key}: expected a non-empty string, got {value!r}")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StorageConfigError(f"{where}: expected a mapping, got {value!r}")
    return value


def _check_keys(section: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(map(str, set(section) - known))
    if unknown:
        raise StorageConfigError(
            f"unknown key {where}.{unknown[0]}", f"not a setting (the settings here are {', '.join(sorted(known))})"
        )


def _durable(mode: str, value: Any, data_dir: str) -> DurableSettings:
    where = "storage.durable"
    section = _mapping(value, where)
    _check_keys(section, {"backend", "root", "endpoint", "region", "access_key", "secret_key"}, where)
    if mode == "local":
        # Local mode keeps its exported history on the broker's own disk.
        return DurableSettings("fs", _string(section, "root", os.path.join(data_dir, "durable"), where + "."))
    if mode == "shared_fs":
        backend = section.get("backend", "fs")
        if backend not in ("fs", "shared_fs", None):
            raise StorageConfigError(
                f"{where}.backend: shared_fs mode stores segments in a directory; "
                f"remove backend {backend!r} or use mode object_store"
            )
        root = section.get("root")
        if not isinstance(root, str) or not root:
            raise StorageConfigError(
                f"{where}.root: shared_fs mode needs the shared directory (e.g. durable: {{root: /mnt/danube}})"
            )
        return DurableSettings("fs", root)
    backend = section.get("backend")
    if backend not in DURABLE_BACKENDS:
        raise StorageConfigError(
            f"{where}.backend: object_store mode supports {', '.join(DURABLE_BACKENDS)}, got {backend!r}"
        )
    root = section.get("root")
    if not isinstance(root, str) or not root.strip("/"):
        raise StorageConfigError(f"{where}.root: object_store mode needs 'bucket' or 'bucket/prefix'")
    root = root.removeprefix("s3://").strip("/")
    bucket = root.partition("/")[0]
    if not (3 <= len(bucket) <= 63):
        raise StorageConfigError(f"{where}.root: bucket name {bucket!r} must be 3 to 63 characters")
    access, secret = section.get("access_key"), section.get("secret_key")
    if (access is None) != (secret is None):
        raise StorageConfigError(
            f"{where}: give both access_key and secret_key, or neither (then the AWS default credential chain is used)"
        )
    endpoint = _string(section, "endpoint", None, where + ".")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise StorageConfigError(f"{where}.endpoint: expected an http(s):// URL, got {endpoint!r}")
    return DurableSettings(
        "s3",
        root,
        endpoint=endpoint,
        region=_string(section, "region", None, where + "."),
        access_key=access,
        secret_key=secret,
    )
