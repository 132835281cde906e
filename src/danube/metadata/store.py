"""The MetadataStore interface every metadata backend implements.

Values are bytes; ``get_json``/``put_json`` are the common JSON helpers.  Keys
are built only in :mod:`danube.metadata.keys`.  Every method is a coroutine and
never blocks the event loop.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    version: int  # increases on every write of this key; 0 never occurs for a stored key


@dataclass(frozen=True)
class WatchEvent:
    kind: str  # "put" or "delete"
    key: str
    value: bytes | None


class MetadataStore(abc.ABC):
    """Async key-value store with prefix reads, compare-and-swap and watches."""

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes) -> int:
        """Store ``value``; return the key's new version."""

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
    def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        """Events for keys under ``prefix`` from now on, until the iterator is closed."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ------------------------------------------------------------ JSON helpers

    async def get_json(self, key: str) -> Any | None:
        kv = await self.get(key)
        return None if kv is None else json.loads(kv.value)

    async def put_json(self, key: str, value: Any) -> int:
        return await self.put(key, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())

    async def __aenter__(self) -> "MetadataStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
