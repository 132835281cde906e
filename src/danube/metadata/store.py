"""The MetadataStore interface every metadata backend implements.

Values are bytes; ``get_json``/``put_json`` are the common JSON helpers.  Keys
are built only in :mod:`danube.metadata.keys`.  Every method is a coroutine and
never blocks the event loop.

Cluster mode needs more than a key-value map, so the interface also carries
etcd's model (the embedded store implements the same semantics):

- a store-wide *revision* that increases by one on every write transaction;
  every key remembers the revision that last changed it (``mod_revision``);
- *leases*: ``grant_lease(ttl)`` → id; keys put with ``lease=id`` disappear
  (with delete events) when the lease expires or is revoked; ``keepalive``
  renews it and returns the remaining TTL, raising :class:`LeaseNotFoundError`
  once it is gone;
- *transactions*: ``txn(compare, success, failure)`` applies ``success`` if every
  :class:`Compare` holds, else ``failure``, atomically, as one revision;
- *watch from a revision*: ``watch(prefix, start_revision=r)`` first replays every
  change under ``prefix`` with revision ≥ r, then follows live changes, each event
  once and in revision order (:class:`CompactedError` if r is older than the
  history the store keeps).
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Sequence

from danube.errors import MetadataError


class LeaseNotFoundError(MetadataError):
    """The lease expired or was revoked (its keys are gone)."""

    retriable = False


class CompactedError(MetadataError):
    """A watch asked for a revision older than the history the store keeps."""

    retriable = False


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    version: int  # increases on every write of this key; 0 never occurs for a stored key
    mod_revision: int = 0  # store revision of the key's last write
    lease: int = 0  # lease the key is attached to (0 = none)


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    key: str
    value: bytes | None
    revision: int = 0  # store revision of the change


_COMPARE_TARGETS = ("version", "value", "mod_revision", "lease")
_COMPARE_OPS = ("==", "!=", "<", ">")


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``target`` of ``key`` ``op`` ``operand``.

    ``version`` and ``mod_revision`` are 0 for an absent key, so
    ``Compare.version(k, "==", 0)`` means "k does not exist".
    """

    key: str
    target: str
    op: str
    operand: Any

    def __post_init__(self) -> None:
        if self.target not in _COMPARE_TARGETS:
            raise ValueError(f"compare target must be one of {_COMPARE_TARGETS}, got {self.target!r}")
        if self.op not in _COMPARE_OPS:
            raise ValueError(f"compare op must be one of {_COMPARE_OPS}, got {self.op!r}")

    @classmethod
    def version(cls, key: str, op: str, version: int) -> "Compare":
        return cls(key, "version", op, int(version))

    @classmethod
    def value(cls, key: str, op: str, value: bytes) -> "Compare":
        return cls(key, "value", op, bytes(value))

    @classmethod
    def mod_revision(cls, key: str, op: str, revision: int) -> "Compare":
        return cls(key, "mod_revision", op, int(revision))

    @classmethod
    def lease(cls, key: str, op: str, lease: int) -> "Compare":
        return cls(key, "lease", op, int(lease))

    def holds(self, kv: "KeyValue | None") -> bool:
        """Evaluate against the key's current state (embedded store; etcd evaluates server-side)."""
        if self.target == "value":
            if kv is None:
                return False  # etcd: a value comparison on an absent key fails
            actual: Any = kv.value
        elif self.target == "version":
            actual = 0 if kv is None else kv.version
        elif self.target == "mod_revision":
            actual = 0 if kv is None else kv.mod_revision
        else:
            actual = 0 if kv is None else kv.lease
        if self.op == "==":
            return actual == self.operand
        if self.op == "!=":
            return actual != self.operand
        if self.op == "<":
            return actual < self.operand
        return actual > self.operand


@dataclass(frozen=True)
class Op:
    """One operation of a transaction (see the constructors)."""

    kind: str  # "put" | "delete" | "get" | "delete_prefix" | "get_prefix"
    key: str
    value: bytes = b""
    lease: int = 0

    @classmethod
    def put(cls, key: str, value: bytes, *, lease: int = 0) -> "Op":
        return cls("put", key, bytes(value), int(lease))

    @classmethod
    def put_json(cls, key: str, value: Any, *, lease: int = 0) -> "Op":
        return cls.put(key, dump_json(value), lease=lease)

    @classmethod
    def delete(cls, key: str) -> "Op":
        return cls("delete", key)

    @classmethod
    def delete_prefix(cls, prefix: str) -> "Op":
        return cls("delete_prefix", prefix)

    @classmethod
    def get(cls, key: str) -> "Op":
        return cls("get", key)

    @classmethod
    def get_prefix(cls, prefix: str) -> "Op":
        return cls("get_prefix", prefix)


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int  # the store revision after the transaction
    # one entry per applied op: put → None, delete/delete_prefix → number deleted,
    # get → KeyValue | None, get_prefix → list[KeyValue]
    results: tuple = ()


def dump_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


class MetadataStore(abc.ABC):
    """Async key-value store with prefix reads, compare-and-swap and watches."""

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Store ``value`` (attached to ``lease`` when non-zero); return the key's new version."""

    @abc.abstractmethod
    async def put_if_version(self, key: str, value: bytes, expected_version: int) -> bool:
        """Store only if the key's version is ``expected_version`` (0 = key absent)."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""

    @abc.abstractmethod
    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key starting with ``prefix``, sorted by key."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int: ...

    @abc.abstractmethod
    def watch(self, prefix: str, *, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        """Events for keys under ``prefix`` from now on (or from ``start_revision``, inclusive),
        until the generator is closed (``aclose``)."""

    # ------------------------------------------------------------ revisions, transactions, leases

    @abc.abstractmethod
    async def revision(self) -> int:
        """The store's current revision (that of the latest write)."""

    @abc.abstractmethod
    async def get_with_revision(self, key: str) -> tuple[KeyValue | None, int]:
        """The key and the store revision the read saw (watch from revision + 1 misses nothing)."""

    @abc.abstractmethod
    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]: ...

    @abc.abstractmethod
    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Atomically: ``success`` if every comparison holds, else ``failure``."""

    @abc.abstractmethod
    async def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds (≥ 1); returns its id."""

    @abc.abstractmethod
    async def keepalive(self, lease_id: int) -> int:
        """Renew the lease; its TTL in seconds. :class:`LeaseNotFoundError` once it is gone."""

    @abc.abstractmethod
    async def revoke_lease(self, lease_id: int) -> None:
        """End the lease now, deleting its keys (no error if it is already gone)."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ------------------------------------------------------------ JSON helpers

    async def get_json(self, key: str) -> Any | None:
        kv = await self.get(key)
        return None if kv is None else json.loads(kv.value)

    async def put_json(self, key: str, value: Any, *, lease: int = 0) -> int:
        return await self.put(key, dump_json(value), lease=lease)

    async def __aenter__(self) -> "MetadataStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
