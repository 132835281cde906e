"""The batching producer of the batch lane.

Messages are collected per partition into an open batch that is sealed when it
reaches ``max_batch_bytes`` or ``linger_ms`` after its first message, encoded
once into the native frame format by the compiled codec and written to one
bidirectional ``Publish`` stream.  At most ``max_in_flight`` batches per
partition await their ack; more sealed batches wait in the client and, beyond
a second window, ``send`` waits (back-pressure).

Acks arrive once a batch is durable and carry its offsets; ``send`` returns a
future of the message's offset.  When the stream breaks with a retriable
status the producer looks the topic up again, re-creates itself and resends
every unacked batch in order (at-least-once: a batch stored just before the
break may be stored twice).

The producer follows its topic like Danube's clients: when the broker answers
``CLOSE`` to the health check, or a batch comes back ``UNAVAILABLE`` (topic
sealed, moved, not served here) or ``NOT_FOUND`` (producer unknown there), the
current stream is drained (no new batches; the acks of those in flight are
awaited, so only batches without a definitive answer are resent), then the
topic is looked up again, the producer re-created under the same name and the
unacked batches resent in order.  The caller's futures see none of it unless
the retry budget runs out, then they fail with a ``ClientError``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from danube import message_codec as frame_codec
from danube.client.connection import BrokerConnection, Connections, RetryState, cancelled_call_error, retrying
from danube.client.errors import from_batch_status, is_retriable
from danube.client.health import PRODUCER, HealthWatch
from danube.client.routing import PartitionRouter, partition_topic
from danube.client.schema import SchemaInfo, SchemaRegistryClient
from danube.errors import ClientError, DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.schema.tag import schema_attributes

log = logging.getLogger(__name__)

_ACCESS_MODES = {"shared": pb.SHARED, "exclusive": pb.EXCLUSIVE}

# Per-message bookkeeping estimate (frame header + fixed body) used to size batches.
_FRAME_OVERHEAD = 38

# Ends a Publish request stream (put on the send queue by close()).
_STOP = object()
# Wakes the request generator so it notices the stream is draining.
_WAKE = object()

# send() lets the event loop run after this many messages queued without suspending.
_YIELD_EVERY = 256

# How long a draining stream may take to answer its in-flight batches before it is cancelled.
DRAIN_TIMEOUT_S = 10.0

# Batch statuses after which the producer follows its topic (re-lookup, re-create, resend).
_FOLLOW_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND})


def _follows_topic(error: BaseException) -> bool:
    return getattr(error, "grpc_code", None) in _FOLLOW_CODES


class ProducerBuilder:
    def __init__(self, client: Connections) -> None:
        self._client = client
        self._topic: str | None = None
        self._name: str | None = None
        self._access_mode = "shared"
        self._reliable = True
        self._partitions: int | None = None
        self._linger_ms = 5.0
        self._max_batch_bytes = 256 * 1024
        self._max_in_flight = 4
        self._schema_ref: tuple[str, int | None, int | None] | None = None

    def with_schema_subject(self, subject: str) -> "ProducerBuilder":
        """Publish with the subject's latest schema (resolved on ``create()``; docs/schema-registry.md)."""
        self._schema_ref = (subject, None, None)
        return self

    def with_schema_version(self, subject: str, version: int) -> "ProducerBuilder":
        """Publish with one pinned version of the subject."""
        self._schema_ref = (subject, int(version), None)
        return self

    def with_schema_min_version(self, subject: str, min_version: int) -> "ProducerBuilder":
        """Publish with the subject's latest version, refusing to start below ``min_version``."""
        self._schema_ref = (subject, None, int(min_version))
        return self

    def with_topic(self, topic: str) -> "ProducerBuilder":
        self._topic = topic
        return self

    def with_name(self, name: str) -> "ProducerBuilder":
        self._name = name
        return self

    def with_access_mode(self, mode: str) -> "ProducerBuilder":
        if mode not in _ACCESS_MODES:
            raise InvalidArgumentError(f"access mode must be one of {sorted(_ACCESS_MODES)}, not {mode!r}")
        self._access_mode = mode
        return self

    def with_reliable(self, reliable: bool = True) -> "ProducerBuilder":
        """Reliable (WAL-backed, the default) or non-reliable (in memory, at-most-once) topic."""
        self._reliable = bool(reliable)
        return self

    def with_reliable_dispatch(self) -> "ProducerBuilder":
        return self.with_reliable(True)

    def with_partitions(self, partitions: int) -> "ProducerBuilder":
        """Produce to the partitioned topic ``<topic>-part-0 .. -part-{n-1}``."""
        if partitions < 1:
            raise InvalidArgumentError("partitions must be at least 1")
        self._partitions = partitions
        return self

    def with_linger_ms(self, linger_ms: float) -> "ProducerBuilder":
        if linger_ms < 0:
            raise InvalidArgumentError("linger_ms must not be negative")
        self._linger_ms = float(linger_ms)
        return self

    def with_max_batch_bytes(self, max_batch_bytes: int) -> "ProducerBuilder":
        if max_batch_bytes < 1:
            raise InvalidArgumentError("max_batch_bytes must be positive")
        self._max_batch_bytes = int(max_batch_bytes)
        return self

    def with_max_in_flight(self, max_in_flight: int) -> "ProducerBuilder":
        if max_in_flight < 1:
            raise InvalidArgumentError("max_in_flight must be at least 1")
        self._max_in_flight = int(max_in_flight)
        return self

    def build(self) -> "Producer":
        if not self._topic:
            raise InvalidArgumentError("a producer needs a topic (with_topic)")
        if not self._name:
            raise InvalidArgumentError("a producer needs a name (with_name)")
        producer = Producer(
            self._client,
            self._topic,
            self._name,
            access_mode=self._access_mode,
            reliable=self._reliable,
            partitions=self._partitions,
            linger_ms=self._linger_ms,
            max_batch_bytes=self._max_batch_bytes,
            max_in_flight=self._max_in_flight,
        )
        producer.schema_ref = self._schema_ref
        return producer


class _Batch:
    """A sealed batch: what to encode, who to tell, and its wire form once encoded."""

    __slots__ = (
        "payloads",
        "keys",
        "attributes",
        "futures",
        "done",
        "frames",
        "encoded_for",
        "sent_at",
        "key",
        "attrs",
        "version",
    )

    def __init__(self, payloads, keys=None, attributes=None, futures=None, done=None, key=None, attrs=None) -> None:
        self.payloads = payloads
        self.keys = keys  # per-message keys (send path) or None
        self.attributes = attributes
        self.futures = futures  # per-message futures (send path) or None
        self.done = done  # one future of (first, last) (send_batch path) or None
        self.key = key  # one key for all (send_batch path)
        self.attrs = attrs
        self.frames: bytes | None = None
        self.encoded_for = -1
        self.sent_at = 0.0
        self.version: int | None = None  # the partitioning version its messages were routed under

    def encode(self, producer_id: int, schema_attrs: dict | None = None) -> bytes:
        """The batch's frames; ``schema_attrs`` (the schema id/version pair) go on every frame."""
        if self.frames is None or self.encoded_for != producer_id:
            now_ms = int(time.time() * 1000)
            if self.keys is None or (not any(k is not None for k in self.keys) and not any(self.attributes)):
                attrs = self.attrs
                if schema_attrs:
                    attrs = {**attrs, **schema_attrs} if attrs else schema_attrs
                self.frames = frame_codec.encode_payloads(
                    self.payloads, publish_time=now_ms, producer_id=producer_id, key=self.key, attributes=attrs
                )
            else:
                attributes = self.attributes
                if schema_attrs:
                    attributes = [{**a, **schema_attrs} if a else schema_attrs for a in attributes]
                self.frames = frame_codec.encode_records(
                    [(now_ms, producer_id, k, a, p) for k, a, p in zip(self.keys, attributes, self.payloads)]
                )
            self.encoded_for = producer_id
        return self.frames

    def resolve(self, first: int, last: int) -> None:
        if self.futures is not None:
            for i, fut in enumerate(self.futures):
                if not fut.done():
                    fut.set_result(first + i)
        if self.done is not None and not self.done.done():
            self.done.set_result((first, last))

    def fail(self, error: BaseException) -> None:
        if self.futures is not None:
            for fut in self.futures:
                if not fut.done():
                    fut.set_exception(error)
        if self.done is not None and not self.done.done():
            self.done.set_exception(error)


class _PartitionProducer:
    """One topic (or one partition): its open batch, its stream, its unacked batches."""

    def __init__(self, owner: "Producer", topic: str) -> None:
        self.owner = owner
        self.topic = topic
        self.producer_id = -1
        self._loop = asyncio.get_running_loop()
        self._payloads: list = []
        self._keys: list = []
        self._attributes: list = []
        self._futures: list = []
        self._open_bytes = 0
        self._has_meta = False
        self._linger_handle: asyncio.TimerHandle | None = None
        self._sequence = itertools.count(1)
        self._unacked: dict[int, _Batch] = {}  # sequence -> batch, in send order
        self._to_send: asyncio.Queue[Any] = asyncio.Queue()  # (sequence, batch), _STOP or _WAKE
        self._window = asyncio.Semaphore(owner.max_in_flight)
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self._closing = False
        self._conn: BrokerConnection | None = None
        self._call = None
        self._streaming = False  # a Publish stream is open (a reconnect may be requested)
        self._draining = False  # that stream takes no new batches; it ends after its acks
        self._drain_reason: BaseException | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._retry = RetryState(owner.client.retry)
        self._stream_broke = False  # the next attempt re-creates the producer first
        self._health: HealthWatch | None = None
        self.reconnects = 0  # times the producer re-created itself (for tests and stats)

    # ------------------------------------------------------------ lifecycle

    async def create(self, conn: BrokerConnection) -> None:
        spec = pb.ProducerSpec(
            topic=self.topic,
            producer_name=self.owner.name,
            access_mode=_ACCESS_MODES[self.owner.access_mode],
            reliable=self.owner.reliable,
            schema_subject=self.owner.schema_ref[0] if self.owner.schema_ref else "",
        )
        answer = await conn.batch_lane.CreateProducer(spec, timeout=10)
        self.producer_id = answer.producer_id
        self._conn = conn

    async def start(self) -> None:
        await self.owner.client.call_with_retry(self.topic, self.create, what="create producer")
        self._task = asyncio.ensure_future(self._run())
        self._health = self.owner.client.watch_health(
            PRODUCER,
            lambda: (self._conn, self.producer_id),
            self._on_health_close,
            what=f"producer {self.owner.name} on {self.topic}",
        )

    def _on_health_close(self) -> None:
        self.request_reconnect(
            ClientError(
                f"the broker closed producer {self.owner.name} ({self.producer_id}) on {self.topic}", retriable=True
            )
        )

    def request_reconnect(self, reason: BaseException) -> None:
        """Drain the current stream, then look the topic up again and re-create the producer."""
        if not self._streaming or self._draining or self._closing or self._failure is not None:
            return
        log.info("producer %s on %s follows its topic (%s)", self.owner.name, self.topic, reason)
        self._draining = True
        self._drain_reason = reason
        self._to_send.put_nowait(_WAKE)
        self._drain_timer = self._loop.call_later(DRAIN_TIMEOUT_S, self._abort_drain)

    def _abort_drain(self) -> None:
        self._drain_timer = None
        call = self._call
        if self._draining and call is not None:
            log.warning("publish stream of %s did not drain in %.0fs; cancelling it", self.topic, DRAIN_TIMEOUT_S)
            call.cancel()

    # ------------------------------------------------------------ adding messages

    async def add(self, payload, key: str | None, attributes: Mapping[str, str] | None) -> asyncio.Future:
        self._check_usable()
        if not self._space.is_set():
            await self._space.wait()
            self._check_usable()
        fut = self._loop.create_future()
        self.add_nowait(payload, key, attributes, fut)
        if self._open_bytes >= self.owner.max_batch_bytes:
            self.seal()
        elif self._linger_handle is None:
            if self.owner.linger_s <= 0:
                self.seal()
            else:
                self._linger_handle = self._loop.call_later(self.owner.linger_s, self.seal)
        return fut

    async def add_batch(
        self, payloads: Sequence, key: str | None, attributes: Mapping[str, str] | None
    ) -> list[asyncio.Future]:
        """Chunks ``payloads`` into batches of at most max_batch_bytes; one future per chunk."""
        self._check_usable()
        self.seal()
        limit = self.owner.max_batch_bytes
        if sum(map(len, payloads)) + len(payloads) * _FRAME_OVERHEAD < limit:  # one chunk: no per-message loop
            return [await self._enqueue_chunk(payloads, key, attributes)] if payloads else []
        done = []
        start, size = 0, 0
        for i, p in enumerate(payloads):
            size += len(p) + _FRAME_OVERHEAD
            if size >= limit:
                done.append(await self._enqueue_chunk(payloads[start : i + 1], key, attributes))
                start, size = i + 1, 0
        if start < len(payloads):
            done.append(await self._enqueue_chunk(payloads[start:], key, attributes))
        return done

    async def _enqueue_chunk(self, payloads, key, attributes) -> asyncio.Future:
        if not self._space.is_set():
            await self._space.wait()
            self._check_usable()
        fut = self._loop.create_future()
        self._enqueue(_Batch(list(payloads), done=fut, key=key, attrs=dict(attributes) if attributes else None))
        return fut

    def seal(self) -> None:
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        if not self._payloads:
            return
        if self._has_meta:
            batch = _Batch(self._payloads, self._keys, self._attributes, self._futures)
        else:
            batch = _Batch(self._payloads, futures=self._futures)
        self._payloads, self._keys, self._attributes, self._futures = [], [], [], []
        self._open_bytes = 0
        self._has_meta = False
        self._enqueue(batch)

    def add_nowait(self, payload, key: str | None, attributes: Mapping[str, str] | None, fut: asyncio.Future) -> None:
        """A message re-routed after a cutover (its future kept); the caller seals."""
        self._payloads.append(payload)
        self._keys.append(key)
        self._attributes.append(attributes)
        self._futures.append(fut)
        if key is not None or attributes:
            self._has_meta = True
        self._open_bytes += len(payload) + _FRAME_OVERHEAD

    def take_unsent(self) -> list[tuple[int, _Batch]]:
        """At a cutover: the queued batches not sent yet leave the queue (to be routed again
        rather than sent, refused and sent again); a stream holding one skips it once it is gone."""
        kept, taken = [], []
        while not self._to_send.empty():
            item = self._to_send.get_nowait()
            if isinstance(item, tuple) and item[1].sent_at == 0.0 and item[0] in self._unacked:
                del self._unacked[item[0]]
                taken.append(item)
            else:
                kept.append(item)
        for item in kept:
            self._to_send.put_nowait(item)
        if taken:
            self._after_ack()
        return taken

    def _enqueue(self, batch: _Batch) -> None:
        batch.version = self.owner.partitioning_version
        seq = next(self._sequence)
        self._unacked[seq] = batch
        self._idle.clear()
        self._to_send.put_nowait((seq, batch))
        if len(self._unacked) >= 2 * self.owner.max_in_flight:
            self._space.clear()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closing:
            raise ClientError(f"producer {self.owner.name} on {self.topic} is closed")

    # ------------------------------------------------------------ the stream

    async def _run(self) -> None:
        """Keeps one Publish stream open; re-creates the producer and resends after retriable failures."""
        try:
            await retrying(
                self._publish,
                self._retry,
                what=f"publish stream of {self.topic}",
                should_retry=self._should_retry,
                give_up=self._gave_up,
            )
        except DanubeError as error:
            self._fail_all(error)

    async def _publish(self) -> None:
        """One attempt: after a broken stream, look the topic up, re-create, requeue; then stream."""
        if self._stream_broke:
            await self.create(await self.owner.client.lookup(self.topic))
            self.reconnects += 1
            self._requeue_unacked()
            if not self._unacked:
                self._retry.reset()  # nothing to prove: the next failure gets a fresh budget
        self._stream_broke = True  # until _stream returns normally (the producer closed)
        await self._stream()

    def _should_retry(self, cause: BaseException) -> bool:
        server_went_away = (
            isinstance(cause, grpc.aio.AioRpcError) and cause.code() == grpc.StatusCode.CANCELLED and not self._closing
        )
        return is_retriable(cause) or server_went_away or _follows_topic(cause)

    def _gave_up(self, error: DanubeError) -> DanubeError:
        failure = ClientError(
            f"producer {self.owner.name} on {self.topic} gave up retrying after "
            f"{self._retry.describe()} (its retry budget is spent); {len(self._unacked)} unacked batch(es) "
            f"failed; last error: {error}"
        )
        failure.__cause__ = error
        return failure

    def _requeue_unacked(self) -> None:
        """After a reconnect every unacked batch is sent again, in its original order."""
        self._to_send = asyncio.Queue()
        for seq in sorted(self._unacked):
            self._to_send.put_nowait((seq, self._unacked[seq]))
        self._window = asyncio.Semaphore(self.owner.max_in_flight)

    async def _stream(self) -> None:
        to_send = self._to_send
        window = self._window
        producer_id = self.producer_id
        stop, wake = _STOP, _WAKE
        unacked = self._unacked
        schema = self.owner.schema  # (schema id, version, frame attributes) or None

        async def requests():
            while True:
                item = await to_send.get()
                if item is stop or self._draining:
                    return
                if item is wake:
                    continue
                seq, batch = item
                await window.acquire()
                if self._draining:
                    return
                if seq not in unacked:  # acked meanwhile by an earlier stream
                    window.release()
                    continue
                batch.sent_at = time.perf_counter()
                if schema is None:
                    request = pb.PublishRequest(sequence=seq, producer_id=producer_id, frames=batch.encode(producer_id))
                else:
                    request = pb.PublishRequest(
                        sequence=seq,
                        producer_id=producer_id,
                        schema_id=schema[0],
                        schema_version=schema[1],
                        frames=batch.encode(producer_id, schema[2]),
                    )
                if batch.version is not None:
                    request.partitioning_version = batch.version
                yield request

        self._draining = False
        self._drain_reason = None
        assert self._conn is not None, "created before streaming"
        call = self._conn.batch_lane.Publish(requests())
        self._call = call
        self._streaming = True
        try:
            async for ack in call:
                window.release()
                batch = unacked.get(ack.sequence)
                if batch is None:
                    continue
                if ack.HasField("status") and ack.status.code != 0:
                    if ack.status.partitions and not self._closing:
                        # routed under a stale partitioning version: nothing was stored; the
                        # producer routes its messages again under the new version
                        del unacked[ack.sequence]
                        self.owner.refused(self, ack.sequence, batch, ack.status)
                        self._after_ack()
                        continue
                    error = from_batch_status(ack.status.code, ack.status.message, ack.status.retriable)
                    if (_follows_topic(error) or error.retriable) and not self._closing:
                        # the batch stays unacked: resent after the budget's backoff and a re-create
                        # (a full WAL disk, RESOURCE_EXHAUSTED, may be freed meanwhile); it fails only
                        # once the retry budget is spent
                        self.request_reconnect(error)
                        continue
                    del unacked[ack.sequence]
                    batch.fail(error)
                else:
                    del unacked[ack.sequence]
                    self._retry.reset()
                    self.owner.on_ack(batch, ack)
                    batch.resolve(ack.first_offset, ack.last_offset)
                self._after_ack()
                if self._closing and not unacked and self._to_send.empty():
                    to_send.put_nowait(stop)
        except asyncio.CancelledError:
            raise cancelled_call_error(f"publish stream of {self.topic} was cancelled by the client") from None
        finally:
            self._call = None
            self._streaming = False
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
        if self._draining:
            raise self._drain_reason or ClientError("publish stream drained for a reconnect", retriable=True)
        if unacked and not self._closing:
            raise ClientError("publish stream ended with unacked batches", retriable=True)

    def _after_ack(self) -> None:
        if len(self._unacked) < 2 * self.owner.max_in_flight:
            self._space.set()
        if not self._unacked:
            self._idle.set()

    def _fail_all(self, error: BaseException) -> None:
        self._failure = error
        health, self._health = self._health, None
        self.owner.client.unwatch_nowait(health)
        for batch in self._unacked.values():
            batch.fail(error)
        self._unacked.clear()
        for fut in self._futures:
            if not fut.done():
                fut.set_exception(error)
        self._payloads, self._keys, self._attributes, self._futures = [], [], [], []
        self._space.set()
        self._idle.set()

    async def flush(self) -> None:
        self.seal()
        await self._idle.wait()
        if self._failure is not None:
            raise self._failure

    async def close(self) -> None:
        try:
            await self.flush()
        finally:
            self._closing = True
            health, self._health = self._health, None
            await self.owner.client.unwatch(health)
            if self._task is not None:
                self._to_send.put_nowait(_STOP)
                try:
                    await asyncio.wait_for(asyncio.shield(self._task), timeout=5)
                except (asyncio.TimeoutError, Exception):
                    self._task.cancel()
                    call = getattr(self, "_call", None)
                    if call is not None:
                        call.cancel()


def _offsets_of(chunk: asyncio.Future) -> asyncio.Future:
    """A future of the offsets ``first..last`` once ``chunk`` (a future of ``(first, last)``) resolves."""
    out = chunk.get_loop().create_future()

    def done(f: asyncio.Future) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        error = f.exception()
        if error is not None:
            out.set_exception(error)
        else:
            first, last = f.result()
            out.set_result(list(range(first, last + 1)))

    chunk.add_done_callback(done)
    return out


class Producer:
    """Batching producer; ``await create()`` before sending (or use ``async with``)."""

    def __init__(
        self,
        client: Connections,
        topic: str,
        name: str,
        *,
        access_mode: str = "shared",
        reliable: bool = True,
        partitions: int | None = None,
        linger_ms: float = 5.0,
        max_batch_bytes: int = 256 * 1024,
        max_in_flight: int = 4,
    ) -> None:
        self.client = client
        self.topic = topic
        self.name = name
        self.access_mode = access_mode
        self.reliable = reliable
        self.linger_s = linger_ms / 1000.0
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight = max_in_flight
        self._requested_partitions = partitions
        self._parts: list[_PartitionProducer] = []
        self._router: PartitionRouter | None = None
        self._ack_listeners: list = []
        self.schema_ref: tuple[str, int | None, int | None] | None = None  # (subject, version, min_version)
        self.schema: tuple[int, int, dict] | None = None  # resolved on create(): (id, version, attributes)
        self.schema_info: SchemaInfo | None = None  # once resolved
        # live repartition (docs/repartition.md): the version the producer routes under (None: the
        # broker has no live routing), the newest (version, partitions) it learned, refused batches
        self.partitioning_version: int | None = None
        self._target: tuple[int, int] | None = None
        self._refused: list[tuple[int, int, _Batch]] = []
        self._routable = asyncio.Event()
        self._routable.set()
        self._cutover: asyncio.Future | None = None
        self.cutovers = 0  # routing switches made (for tests and stats)
        self._unyielded = 0  # messages queued by send() since it last let the event loop run

    @property
    def partitions(self) -> list[str]:
        return [p.topic for p in self._parts]

    @property
    def producer_ids(self) -> list[int]:
        return [p.producer_id for p in self._parts]

    async def create(self) -> "Producer":
        if self._parts:
            return self
        if self.schema_ref is not None and self.schema is None:
            await self._resolve_schema()
        if self._requested_partitions:
            names = [partition_topic(self.topic, i) for i in range(self._requested_partitions)]
        else:
            names = await self.client.call_with_retry(
                self.topic, lambda conn: self.client.partitions(self.topic), what="topic partitions"
            )
        if self._requested_partitions or names != [self.topic]:  # partitioned: live routing
            route = await self.client.topology().route(self.topic)
            if route is not None:
                if route.partitions:
                    names = [partition_topic(self.topic, i) for i in range(route.partitions)]
                self.partitioning_version = route.version
                self._target = (route.version, len(names))
                self.client.topology().cache.listen(self.topic, self._on_route)
        parts = [_PartitionProducer(self, name) for name in names]
        await asyncio.gather(*(p.start() for p in parts))
        self._parts = parts
        self._router = PartitionRouter(len(parts))
        return self

    async def _resolve_schema(self) -> None:
        assert self.schema_ref is not None
        subject, version, min_version = self.schema_ref
        info = await SchemaRegistryClient(self.client).resolve(subject, version=version, min_version=min_version)
        self.schema_info = info
        self.schema = (info.schema_id, info.version, schema_attributes(info.schema_id, info.version))

    def add_ack_listener(self, callback) -> None:
        """``callback(batch_sent_at_perf_counter, first_offset, last_offset)`` on every ack (for bench)."""
        self._ack_listeners.append(callback)

    def on_ack(self, batch: _Batch, ack) -> None:
        for callback in self._ack_listeners:
            callback(batch.sent_at, ack.first_offset, ack.last_offset)

    def _part(self, key: str | None) -> _PartitionProducer:
        if self._router is None:
            raise ClientError("producer not created: await producer.create() first")
        return self._parts[self._router.route(key)]

    async def _routed(self, key: str | None) -> _PartitionProducer:
        """The partition for ``key`` once the producer may route (not during a cutover) and the
        partition has space, so the message is added under the routing it was routed with."""
        while True:
            if not self._routable.is_set():
                await self._routable.wait()
            part = self._part(key)
            if part._space.is_set() or part._failure is not None:
                return part
            await part._space.wait()

    async def send(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> asyncio.Future:
        """Queues one message; returns a future of its offset (in its partition), set once durable."""
        if self._routable.is_set():  # the usual case: no cutover, space in the partition's window
            part = self._part(key)
            if part._space.is_set():
                fut = await part.add(payload, key, attributes)
            else:
                fut = await (await self._routed(key)).add(payload, key, attributes)
        else:
            fut = await (await self._routed(key)).add(payload, key, attributes)
        self._unyielded += 1
        if self._unyielded >= _YIELD_EVERY:
            # a caller sending faster than the broker acks never suspends while a window has room,
            # so without this the acks and the streams wait until every partition's window is full
            # (measured: a 1 s stall of the loop after a grow re-routed the backlog, docs/repartition.md)
            self._unyielded = 0
            await asyncio.sleep(0)
        return fut

    # ------------------------------------------------------------ live repartition

    def _on_route(self, topic: str, route) -> None:
        self._learn(route.version, route.partitions)

    def refused(self, part: _PartitionProducer, sequence: int, batch: _Batch, status) -> None:
        """A batch refused for a stale partitioning version: routed again after the cutover."""
        index = self._parts.index(part) if part in self._parts else len(self._parts)
        self._refused.append((index, sequence, batch))
        self._learn(status.partitioning_version, status.partitions)

    def _learn(self, version: int, partitions: int) -> None:
        if partitions and (self._target is None or version > self._target[0]):
            self._target = (version, partitions)
        if self._cutover is None or self._cutover.done():
            if self._refused or (self._target is not None and self._target[0] != self.partitioning_version):
                self._cutover = asyncio.ensure_future(self._run_cutover())

    async def _run_cutover(self) -> None:
        """The cutover barrier: stop routing, let every batch routed under the old version be acked
        or refused, switch the router, route refused messages again first (in their order), go on."""
        self._routable.clear()
        try:
            while True:
                for index, part in enumerate(self._parts):
                    part.seal()
                    self._refused.extend((index, seq, batch) for seq, batch in part.take_unsent())
                await asyncio.gather(*(part._idle.wait() for part in self._parts))
                assert self._target is not None
                version, partitions = self._target
                for i in range(len(self._parts), partitions):
                    part = _PartitionProducer(self, partition_topic(self.topic, i))
                    await part.start()
                    self._parts.append(part)
                if version != self.partitioning_version:
                    self.partitioning_version = version
                    self._router = PartitionRouter(partitions)
                    self.cutovers += 1
                    log.info(
                        "producer %s on %s routes under version %d (%d partitions)",
                        self.name,
                        self.topic,
                        version,
                        partitions,
                    )
                refused, self._refused = sorted(self._refused, key=lambda r: (r[0], r[1])), []
                for _, _, batch in refused:
                    self._reroute(batch)
                for part in self._parts:
                    part.seal()
                if not self._refused and self._target[0] == self.partitioning_version:
                    return
        except Exception as exc:  # noqa: BLE001 - fail what was refused rather than hang
            for _, _, batch in self._refused:
                batch.fail(exc)
            self._refused = []
            raise
        finally:
            self._routable.set()

    def _reroute(self, batch: _Batch) -> None:
        if batch.futures is not None:
            keys = batch.keys or [None] * len(batch.payloads)
            attributes = batch.attributes or [None] * len(batch.payloads)
            limit = self.max_batch_bytes
            for payload, key, attrs, fut in zip(batch.payloads, keys, attributes, batch.futures):
                part = self._part(key)
                part.add_nowait(payload, key, attrs, fut)
                # sealed at the usual size: the whole re-routed backlog in one batch per partition
                # would be acked only once all of it is stored (no ack for seconds under overload)
                # and could outgrow the broker's message limit
                if part._open_bytes >= limit:
                    part.seal()
        else:
            part = self._part(batch.key)
            part.seal()
            part._enqueue(_Batch(batch.payloads, done=batch.done, key=batch.key, attrs=batch.attrs))

    async def send_and_wait(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> int:
        return await (await self.send(payload, key, attributes))

    async def send_batch(
        self, payloads: Sequence[bytes], key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> asyncio.Future:
        """Queues many messages sharing key and attributes (one partition); future of their offsets."""
        futures = await (await self._routed(key)).add_batch(payloads, key, attributes)
        if len(futures) == 1:  # one chunk (the usual case): no task, no gather
            return _offsets_of(futures[0])

        async def offsets() -> list[int]:
            out: list[int] = []
            for first, last in await asyncio.gather(*futures):
                out.extend(range(first, last + 1))
            return out

        return asyncio.ensure_future(offsets())

    async def flush(self) -> None:
        """Seals the open batches and waits until every queued message is acked."""
        while True:
            await asyncio.gather(*(p.flush() for p in self._parts))
            cutover = self._cutover
            if (cutover is None or cutover.done()) and not self._refused:
                return
            if cutover is not None:  # refused batches are routed again: wait, then flush those too
                await asyncio.gather(cutover, return_exceptions=True)
            else:
                await asyncio.sleep(0)

    async def close(self) -> None:
        if self._target is not None:
            self.client.topology().cache.unlisten(self.topic, self._on_route)
        if self._cutover is not None and not self._cutover.done():
            await asyncio.gather(self._cutover, return_exceptions=True)
        parts, self._parts = self._parts, []
        self._router = None
        results = await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def __aenter__(self) -> "Producer":
        return await self.create()

    async def __aexit__(self, *exc) -> None:
        await self.close()
