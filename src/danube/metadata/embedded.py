"""Embedded MetadataStore on stdlib sqlite3 (standalone brokers; no etcd needed).

All sqlite work runs on one dedicated thread so the event loop never blocks
on a commit.  Durable: WAL journal, synchronous=FULL.

It implements etcd's model (see :mod:`danube.metadata.store`) so one
conformance suite covers both stores:

- ``meta.revision`` counts write transactions; every key row carries its
  ``mod_revision`` and ``lease``;
- every change is also appended to ``log`` (revision, kind, key, value) so a
  watch can start from a past revision; the log keeps the last
  ``HISTORY_REVISIONS`` revisions (older starts raise ``CompactedError``);
- leases live in ``leases`` with a wall-clock deadline; expired ones are
  revoked (keys deleted, delete events sent) before every operation and by a
  sweeper task every ``SWEEP_INTERVAL_S`` while leases exist, so expiry also
  happens when nobody touches the store.  Watch events are queued from the
  sqlite thread right after each commit, hence in revision order.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncGenerator, Sequence

from danube.errors import MetadataError
from danube.metadata.store import (
    CompactedError,
    Compare,
    KeyValue,
    LeaseNotFoundError,
    MetadataStore,
    Op,
    TxnResult,
    WatchEvent,
)

HISTORY_REVISIONS = 10_000
SWEEP_INTERVAL_S = 0.2
_END = "\U0010ffff"


class EmbeddedMetadataStore(MetadataStore):
    def __init__(self, path: str, *, clock=time.time) -> None:
        self._path = path
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="danube-metadata")
        # (prefix, queue, loop); touched only on the sqlite thread
        self._watchers: list[tuple[str, asyncio.Queue, asyncio.AbstractEventLoop]] = []
        self._closed = False
        self._revision = 0
        self._compacted = 0  # history holds revisions > _compacted
        self._writes_since_prune = 0
        self._sweeper: asyncio.Task | None = None
        self._conn: sqlite3.Connection = self._executor.submit(self._open).result()

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, version INTEGER NOT NULL)"
            )
            columns = {row[1] for row in conn.execute("PRAGMA table_info(kv)")}
            if "mod_revision" not in columns:  # a store written before revisions existed
                conn.execute("ALTER TABLE kv ADD COLUMN mod_revision INTEGER NOT NULL DEFAULT 0")
            if "lease" not in columns:
                conn.execute("ALTER TABLE kv ADD COLUMN lease INTEGER NOT NULL DEFAULT 0")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY, ttl INTEGER NOT NULL, "
                "expires_at REAL NOT NULL)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS log (revision INTEGER NOT NULL, kind TEXT NOT NULL, "
                "key TEXT NOT NULL, value BLOB)"
            )
            conn.execute("CREATE INDEX IF NOT EXISTS log_revision ON log(revision)")
            conn.execute("CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease) WHERE lease != 0")
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            self._revision = int(meta.get("revision", 0))
            self._compacted = int(meta.get("compacted", 0))
        except sqlite3.Error as exc:
            raise MetadataError(f"cannot open metadata store at {self._path}: {exc}") from exc
        return conn

    async def _run(self, fn, *args):
        if self._closed:
            raise MetadataError("metadata store is closed", retriable=False)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise MetadataError(f"metadata store error: {exc}") from exc

    # ------------------------------------------------------------ thread-side work

    def _row(self, key: str) -> KeyValue | None:
        row = self._conn.execute("SELECT value, version, mod_revision, lease FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else KeyValue(key, bytes(row[0]), row[1], row[2], row[3])

    def _prefix_rows(self, prefix: str) -> list[KeyValue]:
        rows = self._conn.execute(
            "SELECT key, value, version, mod_revision, lease FROM kv WHERE key >= ? AND key < ? ORDER BY key",
            (prefix, prefix + _END),
        ).fetchall()
        return [KeyValue(k, bytes(v), ver, mr, ls) for k, v, ver, mr, ls in rows]

    def _write(self, body):
        """Expired leases first, then :meth:`_commit` of ``body``."""
        self._expire_leases()
        return self._commit(body)

    def _commit(self, body):
        """Run ``body(revision, events)`` in one sqlite transaction that is one store revision
        (when it changed anything); events are sent to watchers after the commit."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        events: list[WatchEvent] = []
        revision = self._revision + 1
        try:
            result = body(revision, events)
            if events:
                conn.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('revision', ?)", (revision,))
                conn.executemany(
                    "INSERT INTO log(revision, kind, key, value) VALUES (?, ?, ?, ?)",
                    [(revision, e.kind, e.key, e.value) for e in events],
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if events:
            self._revision = revision
            self._writes_since_prune += 1
            if self._writes_since_prune >= 1000:
                self._prune_history()
            self._notify(events)
        return result

    def _prune_history(self) -> None:
        self._writes_since_prune = 0
        floor = self._revision - HISTORY_REVISIONS
        if floor <= self._compacted:
            return
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM log WHERE revision <= ?", (floor,))
        conn.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('compacted', ?)", (floor,))
        conn.execute("COMMIT")
        self._compacted = floor

    def _apply_put(self, revision: int, events: list, key: str, value: bytes, lease: int) -> int:
        conn = self._conn
        if lease and conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone() is None:
            raise LeaseNotFoundError(f"lease {lease:x} not found")
        row = conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
        version = (0 if row is None else row[0]) + 1
        conn.execute(
            "INSERT INTO kv(key, value, version, mod_revision, lease) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, version = excluded.version, "
            "mod_revision = excluded.mod_revision, lease = excluded.lease",
            (key, value, version, revision, lease),
        )
        events.append(WatchEvent("put", key, value, revision))
        return version

    def _apply_delete(self, revision: int, events: list, key: str) -> int:
        cur = self._conn.execute("DELETE FROM kv WHERE key = ?", (key,))
        if cur.rowcount > 0:
            events.append(WatchEvent("delete", key, None, revision))
            return 1
        return 0

    def _apply_delete_prefix(self, revision: int, events: list, prefix: str) -> int:
        keys = [kv.key for kv in self._prefix_rows(prefix)]
        self._conn.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (prefix, prefix + _END))
        events.extend(WatchEvent("delete", k, None, revision) for k in keys)
        return len(keys)

    def _put(self, key: str, value: bytes, expected: int | None, lease: int) -> int | None:
        def body(revision, events):
            if expected is not None:
                row = self._conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
                if (0 if row is None else row[0]) != expected:
                    return None
            return self._apply_put(revision, events, key, value, lease)

        return self._write(body)

    def _delete(self, key: str) -> bool:
        return self._write(lambda revision, events: self._apply_delete(revision, events, key)) > 0

    def _delete_prefix(self, prefix: str) -> int:
        return self._write(lambda revision, events: self._apply_delete_prefix(revision, events, prefix))

    def _txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> TxnResult:
        def body(revision, events):
            ok = all(c.holds(self._row(c.key)) for c in compare)
            results: list[Any] = []
            for op in success if ok else failure:
                if op.kind == "put":
                    self._apply_put(revision, events, op.key, op.value, op.lease)
                    results.append(None)
                elif op.kind == "delete":
                    results.append(self._apply_delete(revision, events, op.key))
                elif op.kind == "delete_prefix":
                    results.append(self._apply_delete_prefix(revision, events, op.key))
                elif op.kind == "get":
                    results.append(self._row(op.key))
                elif op.kind == "get_prefix":
                    results.append(self._prefix_rows(op.key))
                else:
                    raise ValueError(f"unknown transaction op {op.kind!r}")
            return ok, results, bool(events)

        ok, results, wrote = self._write(body)
        return TxnResult(ok, self._revision, tuple(results))

    def _read(self, fn, *args):
        self._expire_leases()
        return fn(*args)

    # leases

    def _grant(self, ttl: int) -> int:
        lease_id = secrets.randbits(62) or 1
        self._conn.execute(
            "INSERT INTO leases(id, ttl, expires_at) VALUES (?, ?, ?)", (lease_id, ttl, self._clock() + ttl)
        )
        return lease_id

    def _keepalive(self, lease_id: int) -> int:
        self._expire_leases()
        row = self._conn.execute("SELECT ttl FROM leases WHERE id = ?", (lease_id,)).fetchone()
        if row is None:
            raise LeaseNotFoundError(f"lease {lease_id:x} not found (expired or revoked)")
        self._conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (self._clock() + row[0], lease_id))
        return int(row[0])

    def _apply_revoke(self, revision: int, events: list, lease_id: int) -> None:
        for (key,) in self._conn.execute("SELECT key FROM kv WHERE lease = ?", (lease_id,)).fetchall():
            self._apply_delete(revision, events, key)
        self._conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))

    def _revoke(self, lease_id: int) -> None:
        self._write(lambda revision, events: self._apply_revoke(revision, events, lease_id))

    def _expire_leases(self) -> int:
        """Revoke every lease past its deadline (one revision each); returns how many leases remain."""
        conn = self._conn
        expired = [
            row[0] for row in conn.execute("SELECT id FROM leases WHERE expires_at <= ?", (self._clock(),)).fetchall()
        ]
        for lease_id in expired:
            self._commit(lambda revision, events, lease_id=lease_id: self._apply_revoke(revision, events, lease_id))
        return conn.execute("SELECT COUNT(*) FROM leases").fetchone()[0]

    # watches (sqlite thread)

    def _notify(self, events: list[WatchEvent]) -> None:
        for prefix, queue, loop in list(self._watchers):
            for event in events:
                if event.key.startswith(prefix):
                    loop.call_soon_threadsafe(queue.put_nowait, event)

    def _subscribe(self, entry, start_revision: int | None) -> None:
        prefix, queue, loop = entry
        if start_revision is not None and start_revision <= self._revision:
            if start_revision <= self._compacted:
                raise CompactedError(f"revision {start_revision} is compacted (history starts after {self._compacted})")
            rows = self._conn.execute(
                "SELECT revision, kind, key, value FROM log WHERE revision >= ? AND key >= ? AND key < ? "
                "ORDER BY revision, rowid",
                (start_revision, prefix, prefix + _END),
            ).fetchall()
            for rev, kind, key, value in rows:
                event = WatchEvent(kind, key, None if value is None else bytes(value), rev)
                loop.call_soon_threadsafe(queue.put_nowait, event)
        self._watchers.append(entry)

    def _unsubscribe(self, entry) -> None:
        if entry in self._watchers:
            self._watchers.remove(entry)

    # ------------------------------------------------------------ interface

    async def get(self, key: str) -> KeyValue | None:
        return await self._run(self._read, self._row, key)

    async def get_with_revision(self, key: str) -> tuple[KeyValue | None, int]:
        return await self._run(self._read, lambda: (self._row(key), self._revision))

    async def revision(self) -> int:
        return await self._run(self._read, lambda: self._revision)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return await self._run(self._put, key, bytes(value), None, int(lease))

    async def put_if_version(self, key: str, value: bytes, expected_version: int) -> bool:
        return await self._run(self._put, key, bytes(value), int(expected_version), 0) is not None

    async def delete(self, key: str) -> bool:
        return await self._run(self._delete, key)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self._run(self._read, self._prefix_rows, prefix)

    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await self._run(self._read, lambda: (self._prefix_rows(prefix), self._revision))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._run(self._delete_prefix, prefix)

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        return await self._run(self._txn, tuple(compare), tuple(success), tuple(failure))

    async def grant_lease(self, ttl: int) -> int:
        ttl = int(ttl)
        if ttl < 1:
            raise ValueError(f"lease ttl must be >= 1 s, got {ttl}")
        lease_id = await self._run(self._grant, ttl)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="danube-lease-sweeper")
        return lease_id

    async def keepalive(self, lease_id: int) -> int:
        return await self._run(self._keepalive, int(lease_id))

    async def revoke_lease(self, lease_id: int) -> None:
        await self._run(self._revoke, int(lease_id))

    async def _sweep(self) -> None:
        while not self._closed:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                remaining = await self._run(self._expire_leases)
            except MetadataError:
                return
            if not remaining:
                return

    async def watch(self, prefix: str, *, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        entry = (prefix, queue, asyncio.get_running_loop())
        await self._run(self._subscribe, entry, start_revision)
        try:
            while True:
                yield await queue.get()
        finally:
            if not self._closed:
                try:
                    self._executor.submit(self._unsubscribe, entry)
                except RuntimeError:
                    pass

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        conn = self._conn

        def _close() -> None:
            conn.close()

        await asyncio.get_running_loop().run_in_executor(self._executor, _close)
        self._executor.shutdown(wait=True)
