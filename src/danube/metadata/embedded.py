"""Embedded MetadataStore on stdlib sqlite3 (standalone brokers; no etcd needed).

All sqlite work runs on one dedicated thread so the event loop never blocks
on a commit.  Durable: WAL journal, synchronous=FULL, and a write is answered only
once its commit is on disk.  Writes share commits (group commit): every write that
arrives while the thread is busy waits in one queue, and the next round applies them
all in one sqlite transaction, each in a savepoint of its own (a failing write is
rolled back alone) and each still its own store revision, so a thousand producers
registering together cost a few syncs, not a thousand.

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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncGenerator, Callable, Sequence

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

# one queued write: (body(revision, events) -> result, finish(result, revision) -> answer, future, loop)
_Write = tuple[Callable[[int, list], Any], Callable[[Any, int], Any], asyncio.Future, asyncio.AbstractEventLoop]


def _same(result: Any, revision: int) -> Any:
    return result


def _settle(answers: list[tuple[asyncio.Future, bool, Any]]) -> None:
    # (future, ok, result or exception), on the future's loop; a caller that gave up (cancelled) is skipped
    for fut, ok, value in answers:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


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
        # writes waiting for the next group commit; _round_queued: a round is submitted and has
        # not yet taken the queue (so a new write needs no new round)
        self._queue: list[_Write] = []
        self._queue_lock = threading.Lock()
        self._round_queued = False
        # No lease expires before _lease_floor (a lower bound of every deadline; -inf: unknown),
        # so the reads and writes before it skip the leases table; _lease_count leases exist then.
        self._lease_floor = float("-inf")
        self._lease_count = 0
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

    async def _run_write(self, body: Callable[[int, list], Any], finish: Callable[[Any, int], Any] = _same):
        """``body(revision, events)`` applied in the next group commit; answers
        ``finish(result, revision)`` (the store's revision right after this write) once durable."""
        if self._closed:
            raise MetadataError("metadata store is closed", retriable=False)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._queue_lock:
            self._queue.append((body, finish, fut, loop))
            submit = not self._round_queued
            self._round_queued = True
        if submit:
            try:
                self._executor.submit(self._commit_round)
            except RuntimeError:  # the executor shut down (closed meanwhile)
                with self._queue_lock:
                    self._round_queued = False
                raise MetadataError("metadata store is closed", retriable=False) from None
        try:
            return await fut
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

    def _commit_round(self) -> None:
        """One group commit: every queued write in one sqlite transaction (one sync), in queue
        order, each in its own savepoint and each one revision when it changed anything."""
        with self._queue_lock:
            writes, self._queue = self._queue, []
            self._round_queued = False
        if not writes:
            return
        answers: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, bool, Any]]] = {}
        try:
            self._expire_leases()
        except sqlite3.Error as exc:
            for _body, _finish, fut, loop in writes:
                answers.setdefault(loop, []).append((fut, False, exc))
            self._answer(answers)
            return
        conn = self._conn
        revision = self._revision
        done: list[tuple[asyncio.Future, asyncio.AbstractEventLoop, bool, Any, list[WatchEvent]]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for body, finish, fut, loop in writes:
                events: list[WatchEvent] = []
                conn.execute("SAVEPOINT write")
                try:
                    result = body(revision + 1, events)
                    if events:
                        conn.executemany(
                            "INSERT INTO log(revision, kind, key, value) VALUES (?, ?, ?, ?)",
                            [(revision + 1, e.kind, e.key, e.value) for e in events],
                        )
                        revision += 1
                    answer = finish(result, revision)
                except Exception as exc:  # noqa: BLE001 - this write fails alone
                    conn.execute("ROLLBACK TO write")
                    conn.execute("RELEASE write")
                    done.append((fut, loop, False, exc, []))
                    continue
                conn.execute("RELEASE write")
                done.append((fut, loop, True, answer, events))
            if revision != self._revision:
                conn.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('revision', ?)", (revision,))
            conn.execute("COMMIT")
        except BaseException as exc:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except sqlite3.Error:  # the connection is gone (closed meanwhile): nothing was committed
                pass
            failure = exc if isinstance(exc, Exception) else MetadataError("metadata commit interrupted")
            for _body, _finish, fut, loop in writes:
                answers.setdefault(loop, []).append((fut, False, failure))
            self._answer(answers)
            if not isinstance(exc, Exception):
                raise
            return
        written = revision - self._revision
        self._revision = revision
        for fut, loop, ok, value, events in done:
            if events:
                self._notify(events)
            answers.setdefault(loop, []).append((fut, ok, value))
        self._answer(answers)
        if written:
            self._writes_since_prune += written
            if self._writes_since_prune >= 1000:
                self._prune_history()

    @staticmethod
    def _answer(answers: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, bool, Any]]]) -> None:
        for loop, batch in answers.items():  # one wake-up per loop, not one per write
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    def _commit(self, body):
        """Run ``body(revision, events)`` alone in one sqlite transaction that is one store revision
        (when it changed anything); events are sent to watchers after the commit.  (Lease expiry's
        revocations; the callers' writes go through :meth:`_commit_round`.)"""
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

    # write bodies: each runs as body(revision, events) in a group commit (:meth:`_commit_round`)

    def _put_body(self, key: str, value: bytes, expected: int | None, lease: int):
        def body(revision, events):
            if expected is not None:
                row = self._conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
                if (0 if row is None else row[0]) != expected:
                    return None
            return self._apply_put(revision, events, key, value, lease)

        return body

    def _txn_body(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]):
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
            return ok, tuple(results)

        return body

    def _read(self, fn, *args):
        self._expire_leases()
        return fn(*args)

    # leases

    def _grant(self, ttl: int) -> int:
        lease_id = secrets.randbits(62) or 1
        deadline = self._clock() + ttl
        self._conn.execute("INSERT INTO leases(id, ttl, expires_at) VALUES (?, ?, ?)", (lease_id, ttl, deadline))
        # (a keepalive only moves a deadline later, so the floor stays a lower bound without it)
        self._lease_floor = min(self._lease_floor, deadline)
        self._lease_count += 1
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
        self._lease_floor = float("-inf")  # recounted on the next check (this may yet be rolled back)

    def _expire_leases(self) -> int:
        """Revoke every lease past its deadline (one revision each); returns how many leases remain."""
        now = self._clock()
        if now < self._lease_floor:
            return self._lease_count
        conn = self._conn
        expired = [row[0] for row in conn.execute("SELECT id FROM leases WHERE expires_at <= ?", (now,)).fetchall()]
        for lease_id in expired:
            self._commit(lambda revision, events, lease_id=lease_id: self._apply_revoke(revision, events, lease_id))
        count, floor = conn.execute("SELECT COUNT(*), MIN(expires_at) FROM leases").fetchone()
        self._lease_count = count
        self._lease_floor = float("inf") if floor is None else floor
        return count

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
        return await self._run_write(self._put_body(key, bytes(value), None, int(lease)))

    async def put_if_version(self, key: str, value: bytes, expected_version: int) -> bool:
        return await self._run_write(self._put_body(key, bytes(value), int(expected_version), 0)) is not None

    async def delete(self, key: str) -> bool:
        return await self._run_write(lambda revision, events: self._apply_delete(revision, events, key) > 0)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self._run(self._read, self._prefix_rows, prefix)

    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]:
        return await self._run(self._read, lambda: (self._prefix_rows(prefix), self._revision))

    async def delete_prefix(self, prefix: str) -> int:
        return await self._run_write(lambda revision, events: self._apply_delete_prefix(revision, events, prefix))

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        body = self._txn_body(tuple(compare), tuple(success), tuple(failure))
        return await self._run_write(body, lambda result, revision: TxnResult(result[0], revision, result[1]))

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
        lease_id = int(lease_id)
        await self._run_write(lambda revision, events: self._apply_revoke(revision, events, lease_id))

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
