"""Embedded MetadataStore on stdlib sqlite3 (standalone brokers; no etcd needed).

All sqlite work runs on one dedicated thread so the event loop never blocks
on a commit.  Durable: WAL journal, synchronous=FULL.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator

from danube.errors import MetadataError
from danube.metadata.store import KeyValue, MetadataStore, WatchEvent


class EmbeddedMetadataStore(MetadataStore):
    def __init__(self, path: str) -> None:
        self._path = path
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="danube-metadata")
        self._local = threading.local()
        self._watchers: list[tuple[str, asyncio.Queue, asyncio.AbstractEventLoop]] = []
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._executor.submit(self._open).result()

    def _open(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL)"
            )
        except sqlite3.Error as exc:
            raise MetadataError(f"cannot open metadata store at {self._path}: {exc}") from exc
        self._conn = conn

    async def _run(self, fn, *args):
        if self._closed:
            raise MetadataError("metadata store is closed", retriable=False)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise MetadataError(f"metadata store error: {exc}") from exc

    # ------------------------------------------------------------ thread-side work

    def _get(self, key: str) -> KeyValue | None:
        row = self._conn.execute("SELECT value, version FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else KeyValue(key, bytes(row[0]), row[1])

    def _put(self, key: str, value: bytes, expected: int | None) -> int | None:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
            current = 0 if row is None else row[0]
            if expected is not None and current != expected:
                conn.execute("ROLLBACK")
                return None
            version = current + 1
            conn.execute(
                "INSERT INTO kv(key, value, version) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version",
                (key, value, version),
            )
            conn.execute("COMMIT")
            return version
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _delete(self, key: str) -> bool:
        cur = self._conn.execute("DELETE FROM kv WHERE key = ?", (key,))
        return cur.rowcount > 0

    def _prefix_rows(self, prefix: str) -> list[KeyValue]:
        rows = self._conn.execute(
            "SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key",
            (prefix, prefix + "\U0010ffff"),
        ).fetchall()
        return [KeyValue(k, bytes(v), ver) for k, v, ver in rows]

    def _delete_prefix(self, prefix: str) -> list[str]:
        conn = self._conn
        keys = [kv.key for kv in self._prefix_rows(prefix)]
        conn.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (prefix, prefix + "\U0010ffff"))
        return keys

    # ------------------------------------------------------------ interface

    def _notify(self, event: WatchEvent) -> None:
        for prefix, queue, loop in list(self._watchers):
            if event.key.startswith(prefix):
                loop.call_soon_threadsafe(queue.put_nowait, event)

    async def get(self, key: str) -> KeyValue | None:
        return await self._run(self._get, key)

    async def put(self, key: str, value: bytes) -> int:
        version = await self._run(self._put, key, bytes(value), None)
        self._notify(WatchEvent("put", key, bytes(value)))
        return version

    async def put_if_version(self, key: str, value: bytes, expected_version: int) -> bool:
        version = await self._run(self._put, key, bytes(value), expected_version)
        if version is None:
            return False
        self._notify(WatchEvent("put", key, bytes(value)))
        return True

    async def delete(self, key: str) -> bool:
        existed = await self._run(self._delete, key)
        if existed:
            self._notify(WatchEvent("delete", key, None))
        return existed

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self._run(self._prefix_rows, prefix)

    async def delete_prefix(self, prefix: str) -> int:
        keys = await self._run(self._delete_prefix, prefix)
        for key in keys:
            self._notify(WatchEvent("delete", key, None))
        return len(keys)

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        entry = (prefix, queue, asyncio.get_running_loop())
        self._watchers.append(entry)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(entry)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = self._conn

        def _close() -> None:
            if conn is not None:
                conn.close()

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)
