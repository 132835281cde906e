"""The batching producer of the batch lane.

Messages are collected per partition into an open batch that is sealed when it
reaches ``max_batch_bytes`` or ``linger_ms`` after its first message, encoded
once into the native frame format by the compiled codec and written to one
bidirectional ``Publish`` stream.  At most ``max_in_flight`` requests per
partition await their ack, and at most two small ones (under a quarter of
``max_batch_bytes``: the client reads one ack per event-loop round trip, so
more only queue their acks); more sealed batches wait in the client (those
queued behind a request being written go out with it, up to
``max_batch_bytes``) and, beyond 2 x ``max_in_flight`` unacked batches,
``send`` waits (back-pressure).

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

The builder and the facade live here; a partition's batching and stream are in
``producer_stream.py``, a sealed batch in ``producer_batch.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from danube.client.connection import Connections
from danube.client.partition_router import PartitionRouter, partition_topic
from danube.client.producer_batch import Batch
from danube.client.producer_stream import ACCESS_MODES, PartitionProducer
from danube.client.schema import SchemaInfo, SchemaRegistryClient
from danube.errors import ClientError, InvalidArgumentError
from danube.schema.tag import schema_attributes

log = logging.getLogger(__name__)

# send() lets the event loop run after this many messages queued without suspending.
_YIELD_EVERY = 256


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
        if mode not in ACCESS_MODES:
            raise InvalidArgumentError(f"access mode must be one of {sorted(ACCESS_MODES)}, not {mode!r}")
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
        self._parts: list[PartitionProducer] = []
        self._router: PartitionRouter | None = None
        self.ack_listeners: list = []  # see add_ack_listener
        self.schema_ref: tuple[str, int | None, int | None] | None = None  # (subject, version, min_version)
        self.schema: tuple[int, int, dict] | None = None  # resolved on create(): (id, version, attributes)
        self.schema_info: SchemaInfo | None = None  # once resolved
        # live repartition (docs/repartition.md): the version the producer routes under (None: the
        # broker has no live routing), the newest (version, partitions) it learned, refused batches
        self.partitioning_version: int | None = None
        self._target: tuple[int, int] | None = None
        self._refused: list[tuple[int, int, Batch]] = []
        self._routable = asyncio.Event()
        self._routable.set()
        self._can_route = True  # == _routable.is_set(), read on every send instead of calling it
        self._cutover: asyncio.Future | None = None
        self.cutovers = 0  # routing switches made (for tests and stats)
        self._unyielded = 0  # messages queued by send() since it last let the event loop run

    @property
    def partitions(self) -> list[str]:
        return [p.topic for p in self._parts]

    @property
    def producer_ids(self) -> list[int]:
        return [p.producer_id for p in self._parts]

    @property
    def reconnects(self) -> int:
        """Times a partition re-created itself and resent its unacked batches (each resend may
        store a batch whose ack was lost a second time)."""
        return sum(p.reconnects for p in self._parts)

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
        parts = [PartitionProducer(self, name) for name in names]
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
        self.ack_listeners.append(callback)

    def on_ack(self, batch: Batch, first: int, last: int) -> None:
        for callback in self.ack_listeners:
            callback(batch.sent_at, first, last)

    def _part(self, key: str | None) -> PartitionProducer:
        if self._router is None:
            raise ClientError("producer not created: await producer.create() first")
        return self._parts[self._router.route(key)]

    async def _routed(self, key: str | None) -> PartitionProducer:
        """The partition for ``key`` once the producer may route (not during a cutover) and the
        partition has space, so the message is added under the routing it was routed with."""
        while True:
            if not self._can_route:
                await self._routable.wait()
            part = self._part(key)
            if part.has_space or part._failure is not None:
                return part
            await part._space.wait()

    async def send(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> asyncio.Future:
        """Queues one message; returns a future of its offset (in its partition), set once durable."""
        if self._can_route:  # the usual case: no cutover, space in the partition's window
            part = self._part(key)
            if part.has_space:
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

    def refused(self, part: PartitionProducer, sequence: int, batch: Batch, status) -> None:
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
        self._can_route = False
        self._routable.clear()
        try:
            while True:
                for index, part in enumerate(self._parts):
                    part.seal()
                    self._refused.extend((index, seq, batch) for seq, batch in part.take_unsent())
                await asyncio.gather(*(part.wait_idle() for part in self._parts))
                assert self._target is not None
                version, partitions = self._target
                for i in range(len(self._parts), partitions):
                    part = PartitionProducer(self, partition_topic(self.topic, i))
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
            self._can_route = True
            self._routable.set()

    def _reroute(self, batch: Batch) -> None:
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
            part._enqueue(
                Batch(batch.payloads, done=batch.done, key=batch.key, attrs=batch.attrs, offsets=batch.offsets)
            )

    async def send_and_wait(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> int:
        return await (await self.send(payload, key, attributes))

    async def send_batch(
        self, payloads: Sequence[bytes], key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> asyncio.Future:
        """Queues many messages sharing key and attributes (one partition); future of their offsets."""
        router = self._router
        if router is not None and self._can_route:  # _part(key) inline
            part = self._parts[0 if router.partitions == 1 else router.route(key)]
            if not part.has_space:
                part = await self._routed(key)
        else:
            part = await self._routed(key)
        fut = part.add_batch_nowait(payloads, key, attributes)
        if fut is not None:  # one batch (the usual case): its future is the offsets' future
            return fut
        futures = await part.add_batch(payloads, key, attributes)

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
