"""Scalable topics in the client (docs/scalable-topics.md): the DAG watch, a key-routing producer
that follows splits and merges, and stream (ordered) / queue consumers.

- :func:`watch_layouts` keeps a DAG watch session open with any broker (``WatchTopic``) and
  yields every layout snapshot, reconnecting on failure.
- :class:`ScalableProducer` sends each message to the ACTIVE segment covering the hash of its
  key (``danube.model.segment_layout.key_hash``; unkeyed messages round robin), one ordinary
  producer per segment topic.  When a layout seals a segment it holds new sends, waits for that
  segment's in-flight messages, re-sends those the sealed segment refused, in their original
  order, to the segments now covering their keys, then lets new sends through: a key's messages
  keep their order across splits and merges, none lost, none stored twice (a refused resend of a
  batch whose ack was lost is looked up in the sealed segment first, ``StoredMessages``).
- :class:`ScalableConsumer` ``kind="stream"`` registers with the controller leader and consumes
  exactly its assigned segments (a child only once the controller says its parents are
  drained; it reports a sealed segment drained once its backlog is 0); ``kind="queue"`` attaches
  to every segment, sealed ones until their backlog is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import grpc

from danube.client.consumer import Consumer
from danube.client.errors import from_rpc_error
from danube.client.messages import Message
from danube.client.producer import Producer
from danube.errors import ClientError, DanubeError
from danube.model.segment_assignment import AssignedSegment, ConsumerAssignment
from danube.model.segment_layout import SegmentLayout, key_hash, segment_topic_name
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_sessions = itertools.count(1)


def _stub(client, url: str | None = None) -> pb_grpc.ScalableTopicsStub:
    address = url.split("://", 1)[-1] if url else None
    return pb_grpc.ScalableTopicsStub(client.connection(address).channel)


@dataclass(frozen=True)
class DagSnapshot:
    layout: SegmentLayout | None
    controller_url: str


async def watch_layouts(client, topic: str, *, retry_s: float = 0.2) -> AsyncIterator[DagSnapshot]:
    """Every DAG snapshot of ``topic`` (first the current one); ends once the topic is deleted."""
    last_epoch = -1
    last_url = None
    while True:
        try:
            call = _stub(client).WatchTopic(pb.ScalableTopicLookup(session_id=next(_sessions), topic=topic))
            async for update in call:
                dag = update.dag
                if dag.deleted:
                    yield DagSnapshot(None, dag.controller_broker_url)
                    return
                layout = SegmentLayout.from_json(dag.metadata_json)
                if layout.epoch == last_epoch and dag.controller_broker_url == last_url:
                    continue  # a replay after a reconnect
                last_epoch, last_url = layout.epoch, dag.controller_broker_url
                yield DagSnapshot(layout, dag.controller_broker_url)
        except grpc.aio.AioRpcError as exc:
            err = from_rpc_error(exc)
            if not err.retriable and exc.code() != grpc.StatusCode.CANCELLED:
                raise err from None
            log.debug("DAG watch of %s: %s; reconnecting", topic, err)
        await asyncio.sleep(retry_s)


class _Layouts:
    """The latest layout of a topic, kept by a DAG watch task; ``on_change`` called on each new one."""

    def __init__(self, client, topic: str, on_change=None) -> None:
        self.client = client
        self.topic = topic
        self.layout: SegmentLayout | None = None
        self.controller_url = ""
        self.changed = asyncio.Event()
        self._on_change = on_change
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._error: BaseException | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dag-watch-{self.topic}")
        await self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _run(self) -> None:
        try:
            async for snap in watch_layouts(self.client, self.topic):
                if snap.layout is None:
                    break
                self.layout, self.controller_url = snap.layout, snap.controller_url
                if self._on_change is not None:
                    self._on_change(snap.layout)
                self.changed.set()
                self._ready.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self._error = exc
        finally:
            self._ready.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


# ---------------------------------------------------------------- producer


class _Entry:
    __slots__ = ("seq", "payload", "key", "attributes", "outer", "segment_id", "refused")

    def __init__(self, seq, payload, key, attributes, outer) -> None:
        self.seq = seq
        self.payload = payload
        self.key = key
        self.attributes = attributes
        self.outer = outer
        self.segment_id = -1
        self.refused = False


def _is_refusal(exc: BaseException) -> bool:
    return "terminated" in str(exc)


class ScalableProducer:
    """``await create()``; ``await send(payload, key)`` → future of ``(segment_id, offset)``."""

    def __init__(self, client, topic: str, name: str, *, linger_ms: float = 5.0, max_in_flight: int = 4) -> None:
        self.client = client
        self.topic = topic
        self.name = name
        self.linger_ms = linger_ms
        self.max_in_flight = max_in_flight
        self._layouts = _Layouts(client, topic, self._on_layout)
        self._producers: dict[int, Producer] = {}
        self._creating: dict[int, asyncio.Future] = {}
        self._outstanding: dict[int, dict[int, _Entry]] = {}
        self._seq = itertools.count()
        self._rr = itertools.count()
        self._hold = asyncio.Event()
        self._hold.set()
        self._rerouting: set[asyncio.Task] = set()
        # per segment: the highest offset acked to this producer and when its producer there was
        # created (wall clock ms, as the frames' publish time): where its unacked messages can be
        self._acked_offset: dict[int, int] = {}
        self._since_ms: dict[int, int] = {}
        self.reroutes = 0  # messages re-sent after a seal (for tests and bench)
        self.found_stored = 0  # messages a sealed segment had stored though their ack was lost

    @property
    def layout(self) -> SegmentLayout:
        assert self._layouts.layout is not None, "create() first"
        return self._layouts.layout

    async def create(self) -> "ScalableProducer":
        await self._layouts.start()
        return self

    async def _producer(self, segment_id: int) -> Producer:
        p = self._producers.get(segment_id)
        if p is not None:
            return p
        pending = self._creating.get(segment_id)
        if pending is None:
            pending = asyncio.ensure_future(self._create(segment_id))
            self._creating[segment_id] = pending
        return await asyncio.shield(pending)

    async def _create(self, segment_id: int) -> Producer:
        seg = self.layout.segment(segment_id)
        self._since_ms.setdefault(segment_id, int(time.time() * 1000))
        p = Producer(
            self.client,
            segment_topic_name(self.topic, seg),
            f"{self.name}-{segment_id}",
            linger_ms=self.linger_ms,
            max_in_flight=self.max_in_flight,
        )
        await p.create()
        self._producers[segment_id] = p
        self._creating.pop(segment_id, None)
        return p

    def _route(self, key: str | None) -> int:
        layout = self.layout
        if key is not None:
            return layout.find_active_segment(key_hash(key)).segment_id
        active = layout.active_segments
        return active[next(self._rr) % len(active)].segment_id

    async def send(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> asyncio.Future:
        """Queue one message; the future resolves to ``(segment_id, offset)`` once durable."""
        while not self._hold.is_set():
            await self._hold.wait()
        outer: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = _Entry(next(self._seq), payload, key, attributes, outer)
        await self._dispatch(entry)
        return outer

    async def send_and_wait(
        self, payload: bytes, key: str | None = None, attributes: Mapping[str, str] | None = None
    ) -> tuple[int, int]:
        return await (await self.send(payload, key, attributes))

    async def _dispatch(self, entry: _Entry) -> None:
        sid = self._route(entry.key)
        entry.segment_id, entry.refused = sid, False
        self._outstanding.setdefault(sid, {})[entry.seq] = entry
        producer = await self._producer(sid)
        inner = await producer.send(entry.payload, entry.key, entry.attributes)
        inner.add_done_callback(functools.partial(self._settled, entry, sid))

    def _settled(self, entry: _Entry, sid: int, inner: asyncio.Future) -> None:
        if entry.outer.done():
            return
        if inner.cancelled():
            self._outstanding.get(sid, {}).pop(entry.seq, None)
            entry.outer.cancel()
            return
        exc = inner.exception()
        if exc is None:
            self._outstanding.get(sid, {}).pop(entry.seq, None)
            offset = inner.result()
            if offset > self._acked_offset.get(sid, -1):
                self._acked_offset[sid] = offset
            entry.outer.set_result((sid, offset))
        elif _is_refusal(exc):
            entry.refused = True  # re-sent once the layout shows the segment sealed
            self._seal_seen(sid)
        else:
            self._outstanding.get(sid, {}).pop(entry.seq, None)
            entry.outer.set_exception(exc)

    def _on_layout(self, layout: SegmentLayout) -> None:
        for sid in list(self._outstanding):
            self._seal_seen(sid)
        for sid in [s for s in self._producers if not layout.segment(s).is_active]:
            self._seal_seen(sid)

    def _seal_seen(self, sid: int) -> None:
        layout = self._layouts.layout
        if layout is None or sid not in layout.segments or layout.segment(sid).is_active:
            return
        if any(t.get_name() == f"reroute-{sid}" for t in self._rerouting):
            return
        if sid not in self._producers and not self._outstanding.get(sid):
            return
        self._hold.clear()  # synchronously, before any new send routes to the children
        task = asyncio.get_running_loop().create_task(self._reroute(sid), name=f"reroute-{sid}")
        self._rerouting.add(task)
        task.add_done_callback(self._reroute_done)

    def _reroute_done(self, task: asyncio.Task) -> None:
        self._rerouting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("re-routing after a seal failed: %s", task.exception())
        if not self._rerouting:
            self._hold.set()

    async def _reroute(self, sid: int) -> None:
        producer = self._producers.pop(sid, None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while any(not e.refused for e in self._outstanding.get(sid, {}).values()):
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.005)  # every in-flight message: stored or refused
        entries = sorted(self._outstanding.pop(sid, {}).values(), key=lambda e: e.seq)
        if producer is not None and producer.reconnects:
            await self._settle_stored(sid, producer, entries, deadline)
        for entry in entries:
            if entry.outer.done():
                continue
            if not entry.refused:
                entry.outer.set_exception(
                    ClientError(f"segment {sid} of {self.topic} was sealed with the message unanswered", retriable=True)
                )
                continue
            self.reroutes += 1
            await self._dispatch(entry)
        if producer is not None:
            with contextlib.suppress(DanubeError, grpc.aio.AioRpcError):
                await producer.close()

    async def _settle_stored(self, sid: int, producer: Producer, entries: list[_Entry], deadline: float) -> None:
        """Resolve the refused messages the sealed segment stored after all.

        A refusal is definitive only for the attempt it answers: when the broker that stored a batch
        died before its ack went out (a leader that sealed its own segment, a crash), the producer
        resent the batch, and the new owner refused it as sealed.  The producer's messages are
        appended in the order sent, so what the segment holds of them above the last acked offset
        is the first ones of the refused (the rest were never stored): those keep their offsets
        here and only the others go to the children."""
        refused = [e for e in entries if not e.outer.done()]
        if not refused or not all(e.refused for e in refused):
            return  # nothing refused, or some never answered (they fail): the run is not known to be whole
        request = pb.StoredMessagesRequest(
            segment_topic=segment_topic_name(self.topic, self.layout.segment(sid)),
            producer_id=producer.producer_ids[0],
            after_offset=self._acked_offset.get(sid, -1),
            since_publish_time=self._since_ms.get(sid, 0),
        )
        loop = asyncio.get_running_loop()
        while True:
            try:
                reply = await _stub(self.client).StoredMessages(request, timeout=max(1.0, deadline - loop.time()))
                break
            except grpc.aio.AioRpcError as exc:
                err = from_rpc_error(exc)
                if not err.retriable or loop.time() > deadline:
                    # no answer: re-sent like refused ones (at-least-once rather than lost)
                    log.warning("segment %d of %s: what it stored is unknown (%s); re-sending", sid, self.topic, err)
                    return
                await asyncio.sleep(0.1)
        offsets = list(reply.offsets)
        if len(offsets) > len(refused):  # not this producer's run alone (another with its name?)
            log.warning(
                "segment %d of %s holds %d unacked messages of producer %s, more than the %d it has unanswered; "
                "re-sending them all",
                sid,
                self.topic,
                len(offsets),
                self.name,
                len(refused),
            )
            return
        for entry, offset in zip(refused, offsets):
            self.found_stored += 1
            entry.outer.set_result((sid, offset))

    async def flush(self) -> None:
        while True:
            await self._hold.wait()
            futures = [e.outer for d in self._outstanding.values() for e in d.values()]
            await asyncio.gather(*(p.flush() for p in list(self._producers.values())), return_exceptions=True)
            if futures:
                await asyncio.wait(futures)
            if self._hold.is_set() and not any(self._outstanding.values()):
                return

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(30):
                await self.flush()
        await self._layouts.stop()
        for p in list(self._producers.values()):
            with contextlib.suppress(Exception):
                await p.close()
        self._producers.clear()


# ---------------------------------------------------------------- consumers

STREAM, QUEUE = "stream", "queue"


class ScalableConsumer:
    """``kind="stream"`` (ordered: assigned segments) or ``"queue"`` (every segment).

    ``async for message in consumer`` yields :class:`Message` s (``message.topic`` is the segment
    topic); ``await consumer.ack(message)``."""

    def __init__(
        self,
        client,
        topic: str,
        subscription: str,
        name: str,
        *,
        kind: str = STREAM,
        drain_check_s: float = 0.1,
        consumer_id: int = 0,
    ) -> None:
        if kind not in (STREAM, QUEUE):
            raise ValueError(f"kind is {STREAM!r} or {QUEUE!r}")
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.name = name
        self.kind = kind
        self.consumer_id = consumer_id
        self.drain_check_s = drain_check_s
        self._layouts = _Layouts(client, topic, self._on_layout)
        self._consumers: dict[str, Consumer] = {}  # segment topic -> consumer
        self._readers: dict[str, asyncio.Task] = {}
        self._segment_ids: dict[str, int] = {}
        self._sealed: set[str] = set()
        self._drained: set[str] = set()  # queue: sealed segments read to their end (not attached again)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self.assignment: ConsumerAssignment | None = None
        self.assignment_changed = asyncio.Event()
        self._closed = False

    async def subscribe(self) -> "ScalableConsumer":
        await self._layouts.start()
        loop = asyncio.get_running_loop()
        if self.kind == STREAM:
            self._tasks.append(loop.create_task(self._registration(), name=f"scalable-register-{self.name}"))
        else:
            await _stub(self.client).CreateSubscription(
                pb.ScalableSubscriptionRequest(topic=self.topic, subscription=self.subscription, type=QUEUE)
            )
            self._apply_queue(self._layouts.layout)
        self._tasks.append(loop.create_task(self._drain_loop(), name=f"scalable-drain-{self.name}"))
        return self

    # ------------------------------------------------------------ which segments to read

    def _on_layout(self, layout: SegmentLayout) -> None:
        if self.kind == QUEUE and self._tasks:
            self._apply_queue(layout)

    def _apply_queue(self, layout: SegmentLayout | None) -> None:
        """Every segment, ACTIVE and SEALED (as PIP-468's queue consumers): a sealed one until it is drained for the
        subscription (what it still holds may predate this consumer), a pruned one not at all."""
        if layout is None:
            return
        names = {segment_topic_name(self.topic, seg): seg for seg in layout.segments.values()}
        for name in list(self._consumers):
            if name not in names:
                self._detach(name)
        for name, seg in names.items():
            if name in self._drained:
                continue
            if not seg.is_active:
                self._sealed.add(name)
            if name not in self._consumers:
                self._attach(name, seg.segment_id, "shared")

    def _apply_assignment(self, assignment: ConsumerAssignment) -> None:
        self.assignment = assignment
        wanted: dict[str, AssignedSegment] = {s.topic_name: s for s in assignment.segments if not s.waiting_for}
        for name in list(self._consumers):
            if name not in wanted:
                self._detach(name)
        for name, seg in wanted.items():
            if seg.sealed:
                self._sealed.add(name)
            if name not in self._consumers:
                self._attach(name, seg.segment_id, "failover")
        self.assignment_changed.set()

    def _attach(self, topic: str, segment_id: int, sub_type: str) -> None:
        consumer = Consumer(self.client, topic, self.name, self.subscription, sub_type=sub_type, reliable=True)
        self._consumers[topic] = consumer
        self._segment_ids[topic] = segment_id
        self._readers[topic] = asyncio.get_running_loop().create_task(
            self._read(topic, consumer), name=f"scalable-read-{topic}"
        )

    def _detach(self, topic: str) -> None:
        consumer = self._consumers.pop(topic, None)
        reader = self._readers.pop(topic, None)
        self._sealed.discard(topic)
        if reader is not None:
            reader.cancel()
        if consumer is not None:
            asyncio.get_running_loop().create_task(_quiet_close(consumer))

    async def _read(self, topic: str, consumer: Consumer) -> None:
        try:
            await consumer.subscribe()
            async for batch in consumer.batches():
                for message in batch:
                    await self._queue.put(message)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - surfaced to the reader
            if not self._closed:
                log.warning("segment consumer of %s ended: %s", topic, exc)

    async def _registration(self) -> None:
        while not self._closed:
            url = self._layouts.controller_url
            try:
                call = _stub(self.client, url or None).RegisterConsumer(
                    pb.RegisterConsumerRequest(
                        topic=self.topic,
                        subscription=self.subscription,
                        consumer_name=self.name,
                        consumer_id=self.consumer_id,
                    )
                )
                async for update in call:
                    self._apply_assignment(ConsumerAssignment.from_json(json.loads(update.assignment_json)))
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.debug("registration of %s with %s: %s", self.name, url, exc.details())
            await asyncio.sleep(0.2)

    async def _drain_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.drain_check_s)
            for topic in list(self._sealed):
                if topic not in self._consumers:
                    continue
                try:
                    if self.kind == STREAM:
                        await _stub(self.client, self._layouts.controller_url or None).SegmentDrained(
                            pb.SegmentDrainedRequest(
                                topic=self.topic, subscription=self.subscription, segment_id=self._segment_ids[topic]
                            )
                        )
                        self._sealed.discard(topic)  # the controller pushes the next assignment
                    else:
                        reply = await _stub(self.client).SegmentStats(pb.SegmentRequest(segment_topic=topic))
                        stats = json.loads(reply.json)
                        sub = stats.get("subscriptions", {}).get(self.subscription)
                        if stats.get("terminated") and sub is not None and sub.get("backlog", 1) == 0:
                            self._drained.add(topic)
                            self._detach(topic)
                except grpc.aio.AioRpcError:
                    pass  # not drained yet

    # ------------------------------------------------------------ reading and acking

    async def receive(self, timeout: float | None = None) -> Message | None:
        if timeout is None:
            return await self._queue.get()
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (gh-86296)
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self._queue.get()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self.messages()

    async def ack(self, message: Message) -> None:
        consumer = self._consumers.get(message.topic)
        if consumer is not None:
            await consumer.ack(message)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for topic in list(self._consumers):
            reader = self._readers.pop(topic, None)
            if reader is not None:
                reader.cancel()
            consumer = self._consumers.pop(topic)
            await _quiet_close(consumer)
        await self._layouts.stop()


async def _quiet_close(consumer: Consumer) -> None:
    with contextlib.suppress(BaseException):
        await consumer.close()
