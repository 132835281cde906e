"""MetadataStore on etcd v3 (cluster mode).

The gRPC stubs are aetcd's (``aetcd.rpc``: etcd's ``rpc.proto`` generated for
protobuf 4-7, so they import next to the project's own protobuf 7 stubs; the old
``etcd3`` package does not import with protobuf ≥ 4).  The calls themselves are
made here on a ``grpc.aio`` channel rather than through ``aetcd.Client``,
because the store needs what that client hides: the response header's revision,
``prev_kv`` on put (to return the key's new version), watches that resume from
the last seen revision after a reconnect, and transactions built from
:class:`~danube.metadata.store.Compare` / :class:`~danube.metadata.store.Op`.

Reconnect: the channel reconnects by itself (short backoff, see
``CHANNEL_OPTIONS``); every unary call waits for the channel to be ready and
is retried on UNAVAILABLE until ``retry_timeout`` has passed, then fails with a
retriable :class:`~danube.errors.MetadataError`.  A watch whose stream breaks
re-creates itself from the revision after the last event it delivered, so a
consumer of ``watch`` sees every change once, across etcd restarts.

Caveat: a transaction retried after UNAVAILABLE may already have been applied
(etcd answered, the answer was lost).  Callers use compare-and-swap
transactions, whose retry then simply fails the comparison.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncGenerator, Sequence
from urllib.parse import urlparse

import grpc

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

try:  # the `cluster` extra
    from aetcd import rpc
except ImportError as exc:  # pragma: no cover - only without the extra
    rpc = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)
_CMP_RESULT = {"==": 0, ">": 1, "<": 2, "!=": 3}
_CMP_TARGET = {"version": 0, "mod_revision": 2, "value": 3, "lease": 4}


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with prefix"."""
    buf = bytearray(prefix)
    while buf:
        if buf[-1] < 0xFF:
            buf[-1] += 1
            return bytes(buf)
        buf.pop()
    return b"\0"  # every key


def parse_endpoints(url: str) -> str:
    """``http://h:p[,http://h2:p2]`` (or bare ``h:p``) → a gRPC target."""
    hosts = []
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        parsed = urlparse(part if "://" in part else f"http://{part}")
        if parsed.scheme not in ("http", ""):
            raise MetadataError(f"etcd endpoint {part!r}: only http:// is supported", retriable=False)
        if not parsed.hostname or not parsed.port:
            raise MetadataError(f"etcd endpoint {part!r}: expected http://host:port", retriable=False)
        hosts.append(f"{parsed.hostname}:{parsed.port}")
    if not hosts:
        raise MetadataError(f"no etcd endpoint in {url!r}", retriable=False)
    if len(hosts) == 1:
        return hosts[0]
    return "ipv4:" + ",".join(hosts)


def _kv(kv) -> KeyValue:
    return KeyValue(kv.key.decode(), bytes(kv.value), int(kv.version), int(kv.mod_revision), int(kv.lease))


class EtcdMetadataStore(MetadataStore):
    """``EtcdMetadataStore("http://127.0.0.1:2379")``; ``retry_timeout`` bounds how long a call
    keeps retrying while etcd is unreachable."""

    def __init__(self, endpoints: str, *, retry_timeout: float = 10.0) -> None:
        if rpc is None:
            raise MetadataError(
                f"cluster mode needs the etcd client: pip install 'danube-broker[cluster]' ({_IMPORT_ERROR})",
                retriable=False,
            )
        self.endpoints = endpoints
        self.retry_timeout = retry_timeout
        self._target = parse_endpoints(endpoints)
        self._channel: grpc.aio.Channel | None = None
        self._closed = False

    # ------------------------------------------------------------ plumbing

    def _stubs(self):
        if self._closed:
            raise MetadataError("metadata store is closed", retriable=False)
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=CHANNEL_OPTIONS)
            self._kv_stub = rpc.KVStub(self._channel)
            self._lease_stub = rpc.LeaseStub(self._channel)
            self._watch_stub = rpc.WatchStub(self._channel)
        return self._kv_stub, self._lease_stub, self._watch_stub

    async def _call(self, what: str, fn, request):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_timeout
        delay = 0.05
        while True:
            remaining = deadline - loop.time()
            try:
                return await fn(request, timeout=max(0.1, remaining), wait_for_ready=True)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if self._closed:
                    raise MetadataError("metadata store is closed", retriable=False) from exc
                if code not in _RETRY_CODES or loop.time() + delay >= deadline:
                    raise self._error(what, exc) from exc
                log.debug("etcd %s failed (%s); retrying", what, code.name)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _error(self, what: str, exc: grpc.aio.AioRpcError) -> MetadataError:
        details = exc.details() or ""
        if "requested lease not found" in details:
            return LeaseNotFoundError(f"etcd {what}: {details}")
        if exc.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
            return CompactedError(f"etcd {what}: {details}")
        retriable = exc.code() in _RETRY_CODES
        return MetadataError(
            f"etcd {what} failed at {self.endpoints}: {exc.code().name} {details}", retriable=retriable
        )

    # ------------------------------------------------------------ reads and writes

    async def get_with_revision(self, key: str) -> tuple[KeyValue | None, int]:
        kv_stub, _, _ = self._stubs()
        resp = await self._call("get", kv_stub.Range, rpc.RangeRequest(key=key.encode()))
        return (_kv(resp.kvs[0]) if resp.kvs else None), int(resp.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        return (await self.get_with_revision(key))[0]

    async def revision(self) -> int:
        kv_stub, _, _ = self._stubs()
        # a count-only range over one key still returns the store revision in its header
        resp = await self._call("revision", kv_stub.Range, rpc.RangeRequest(key=b"\0", count_only=True))
        return int(resp.header.revision)

    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]:
        kv_stub, _, _ = self._stubs()
        p = prefix.encode()
        resp = await self._call(
            "get_prefix",
            kv_stub.Range,
            rpc.RangeRequest(
                key=p, range_end=prefix_end(p), sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY
            ),
        )
        return [_kv(kv) for kv in resp.kvs], int(resp.header.revision)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return (await self.get_prefix_with_revision(prefix))[0]

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        kv_stub, _, _ = self._stubs()
        resp = await self._call(
            "put", kv_stub.Put, rpc.PutRequest(key=key.encode(), value=bytes(value), lease=int(lease), prev_kv=True)
        )
        return (int(resp.prev_kv.version) + 1) if resp.HasField("prev_kv") else 1

    async def put_if_version(self, key: str, value: bytes, expected_version: int) -> bool:
        result = await self.txn([Compare.version(key, "==", expected_version)], [Op.put(key, value)])
        return result.succeeded

    async def delete(self, key: str) -> bool:
        kv_stub, _, _ = self._stubs()
        resp = await self._call("delete", kv_stub.DeleteRange, rpc.DeleteRangeRequest(key=key.encode()))
        return resp.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        kv_stub, _, _ = self._stubs()
        p = prefix.encode()
        resp = await self._call(
            "delete_prefix", kv_stub.DeleteRange, rpc.DeleteRangeRequest(key=p, range_end=prefix_end(p))
        )
        return int(resp.deleted)

    # ------------------------------------------------------------ transactions

    @staticmethod
    def _compare(c: Compare):
        msg = rpc.Compare(key=c.key.encode(), result=_CMP_RESULT[c.op], target=_CMP_TARGET[c.target])
        if c.target == "version":
            msg.version = c.operand
        elif c.target == "mod_revision":
            msg.mod_revision = c.operand
        elif c.target == "value":
            msg.value = c.operand
        else:
            msg.lease = c.operand
        return msg

    @staticmethod
    def _request_op(op: Op):
        key = op.key.encode()
        if op.kind == "put":
            return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=op.value, lease=op.lease))
        if op.kind == "delete":
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))
        if op.kind == "delete_prefix":
            return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=prefix_end(key)))
        if op.kind == "get":
            return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))
        if op.kind == "get_prefix":
            return rpc.RequestOp(
                request_range=rpc.RangeRequest(
                    key=key,
                    range_end=prefix_end(key),
                    sort_order=rpc.RangeRequest.ASCEND,
                    sort_target=rpc.RangeRequest.KEY,
                )
            )
        raise ValueError(f"unknown transaction op {op.kind!r}")

    async def txn(
        self, compare: Sequence[Compare], success: Sequence[Op] = (), failure: Sequence[Op] = ()
    ) -> TxnResult:
        kv_stub, _, _ = self._stubs()
        request = rpc.TxnRequest(
            compare=[self._compare(c) for c in compare],
            success=[self._request_op(o) for o in success],
            failure=[self._request_op(o) for o in failure],
        )
        resp = await self._call("txn", kv_stub.Txn, request)
        ops = success if resp.succeeded else failure
        results: list[Any] = []
        for op, r in zip(ops, resp.responses):
            if op.kind == "put":
                results.append(None)
            elif op.kind in ("delete", "delete_prefix"):
                results.append(int(r.response_delete_range.deleted))
            elif op.kind == "get":
                kvs = r.response_range.kvs
                results.append(_kv(kvs[0]) if kvs else None)
            else:
                results.append([_kv(kv) for kv in r.response_range.kvs])
        return TxnResult(bool(resp.succeeded), int(resp.header.revision), tuple(results))

    # ------------------------------------------------------------ leases

    async def grant_lease(self, ttl: int) -> int:
        ttl = int(ttl)
        if ttl < 1:
            raise ValueError(f"lease ttl must be >= 1 s, got {ttl}")
        _, lease_stub, _ = self._stubs()
        resp = await self._call("lease grant", lease_stub.LeaseGrant, rpc.LeaseGrantRequest(TTL=ttl))
        if resp.error:
            raise MetadataError(f"etcd lease grant: {resp.error}")
        return int(resp.ID)

    async def keepalive(self, lease_id: int) -> int:
        _, lease_stub, _ = self._stubs()

        async def once(request, *, timeout, wait_for_ready):
            call = lease_stub.LeaseKeepAlive(iter([request]), timeout=timeout, wait_for_ready=wait_for_ready)
            try:
                async for reply in call:
                    return reply
            finally:
                call.cancel()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "keepalive stream ended without an answer",
            )

        reply = await self._call("lease keepalive", once, rpc.LeaseKeepAliveRequest(ID=int(lease_id)))
        if reply.TTL <= 0:
            raise LeaseNotFoundError(f"lease {lease_id:x} not found (expired or revoked)")
        return int(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> None:
        _, lease_stub, _ = self._stubs()
        try:
            await self._call("lease revoke", lease_stub.LeaseRevoke, rpc.LeaseRevokeRequest(ID=int(lease_id)))
        except LeaseNotFoundError:
            pass

    # ------------------------------------------------------------ watches

    async def watch(self, prefix: str, *, start_revision: int | None = None) -> AsyncGenerator[WatchEvent, None]:
        """Follows ``prefix``; on a broken stream it re-creates the watch from the revision after
        the last event delivered (or after the revision the watch started at)."""
        _, _, watch_stub = self._stubs()
        p = prefix.encode()
        next_revision = start_revision  # None: from now on (first creation only)
        loop = asyncio.get_running_loop()
        delay = 0.05
        down_since: float | None = None
        while True:
            create = rpc.WatchCreateRequest(key=p, range_end=prefix_end(p), start_revision=next_revision or 0)
            queue: asyncio.Queue = asyncio.Queue()
            await queue.put(rpc.WatchRequest(create_request=create))

            async def requests():
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield item

            call = watch_stub.Watch(requests(), wait_for_ready=True)
            try:
                async for resp in call:
                    down_since, delay = None, 0.05
                    if resp.compact_revision:
                        raise CompactedError(
                            f"etcd watch on {prefix}: revision {next_revision} is compacted "
                            f"(oldest available {resp.compact_revision})"
                        )
                    if resp.created and next_revision is None:
                        next_revision = int(resp.header.revision) + 1
                    if resp.canceled:
                        raise MetadataError(f"etcd cancelled the watch on {prefix}: {resp.cancel_reason}")
                    for ev in resp.events:
                        kv = ev.kv
                        revision = int(kv.mod_revision)
                        next_revision = revision + 1
                        if ev.type == 0:
                            yield WatchEvent("put", kv.key.decode(), bytes(kv.value), revision)
                        else:
                            yield WatchEvent("delete", kv.key.decode(), None, revision)
                # the server ended the stream: re-create it
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    return
                if exc.code() not in _RETRY_CODES and exc.code() != grpc.StatusCode.CANCELLED:
                    raise self._error("watch", exc) from exc
                now = loop.time()
                down_since = down_since or now
                log.debug(
                    "etcd watch on %s broke (%s); resuming from revision %s", prefix, exc.code().name, next_revision
                )
            finally:
                queue.put_nowait(None)
                call.cancel()
            if self._closed:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
