"""The batch lane: gRPC service ``danube_batch.BatchLane`` (protocol in docs/batch-lane.md).

Each request carries a whole batch of frames as one ``bytes`` field.  The
service does no per-message work: it checks the whole buffer with one call to
the codec (``danube.message_codec.validate``), hands the bytearray to
``BrokerService.publish`` (which stamps offsets in place, appends and waits for
durability), and on the way out hands the broker's frame buffers to gRPC as
they are.  Errors of one batch are answered in that batch's ack and the stream
goes on; errors map to gRPC codes only in ``danube.server.status``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, AsyncIterator, cast

import grpc

from danube import message_codec as frame_codec
from danube._tasks import wake
from danube.broker.acks import AckBatcher
from danube.errors import DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.proto.danube_batch import batch_pb2_grpc as pb_grpc
from danube.server import status as status_map
from danube.server.h2grpc.wire import Encoded, varint

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.routing.repartition.runtime import RepartitionRuntime
    from danube.routing.repartition.version_fence import StaleRoutingError
    from danube.schema.validation import SchemaGate

log = logging.getLogger(__name__)

# Batches of one Publish stream being stored at once (the client's in-flight window
# normally keeps below this; beyond it the stream stops reading, which pushes back).
MAX_STREAM_IN_FLIGHT = 64

_ACCESS_MODES = {pb.SHARED: "shared", pb.EXCLUSIVE: "exclusive"}
_SUB_TYPES = {
    pb.EXCLUSIVE_SUBSCRIPTION: "exclusive",
    pb.SHARED_SUBSCRIPTION: "shared",
    pb.FAILOVER_SUBSCRIPTION: "failover",
    pb.KEY_SHARED_SUBSCRIPTION: "key_shared",
}


def _batch_status(exc: BaseException) -> pb.BatchStatus:
    status = pb.BatchStatus(
        code=status_map.status_for(exc).value[0],
        message=status_map.message_for(exc),
        retriable=bool(getattr(exc, "retriable", False)),
    )
    if getattr(exc, "partitions", None):  # a stale partitioning version (docs/repartition.md)
        stale = cast("StaleRoutingError", exc)
        status.partitioning_version = stale.version
        status.partitions = stale.partitions
        status.redirect_url = stale.redirect_url
    return status


_abort = status_map.abort


def redelivery_counts_in_frame_order(buf, by_offset) -> list[int]:
    """One count per frame of ``buf``, in frame order (0 = first delivery), from the broker's
    ``{offset: count}``; empty when no message of the batch is a redelivery."""
    if not by_offset or not any(by_offset.values()):
        return []
    view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf.cast("B")
    return [by_offset.get(int.from_bytes(view[p : p + 8], "little"), 0) for p in frame_codec.frame_positions(view)]


# ConsumeResponse.batch (field 2) and ConsumeBatch.frames (field 1), both length-delimited.
_BATCH_TAG = b"\x12"
_FRAMES_TAG = b"\x0a"


def _encoded_batch(frames, rest: bytes) -> Encoded:
    """``ConsumeResponse(batch=...)`` serialized around the delivered frames' own buffer: the
    frames field first, then ``rest`` (the batch's other fields; protobuf fields may come in
    any order)."""
    size = len(frames)
    frames_head = _FRAMES_TAG + varint(size)
    inner = len(frames_head) + size + len(rest)
    return Encoded((_BATCH_TAG + varint(inner) + frames_head, frames, rest))


def _encoded_ack(sequence: int, producer_id: int, first: int, last: int) -> Encoded:
    """A stored batch's ``PublishAck`` as protobuf serializes it (fields 1-5 as varints, zeros
    left out), without building the message."""
    out = b"\x08" + varint(sequence) if sequence else b""
    if producer_id:
        out += b"\x10" + varint(producer_id)
    if first:
        out += b"\x18" + varint(first)
    if last:
        out += b"\x20" + varint(last)
    return Encoded((out + b"\x28" + varint(last - first + 1),))


def _batch_fields(first: int, last: int, count: int) -> bytes:
    """``ConsumeBatch``'s first_offset (2), last_offset (3) and count (4) as protobuf serializes
    them (varints; a zero is left out), without building the message."""
    out = b""
    if first:
        out = b"\x10" + varint(first)
    if last:
        out += b"\x18" + varint(last)
    if count:
        out += b"\x20" + varint(count)
    return out


def _validate_frames(frames: bytes) -> bytearray:
    """One codec call over the whole batch; a writable copy for in-place stamping."""
    if not frames:
        raise InvalidArgumentError("empty batch: a publish request needs at least one frame")
    frame_codec.validate(frames)
    return bytearray(frames)


class _NotLoaded(Exception):
    """An ack for a consumer not loaded here yet: it takes the awaited path."""


def _ack_pairs(ranges) -> tuple[list[tuple[int, int]], int]:
    """An ack request's ranges as (first, last) pairs, and how many offsets they name."""
    pairs: list[tuple[int, int]] = []
    named = 0
    for r in ranges:
        first, last = r.first, r.last
        if last < first:
            raise InvalidArgumentError(f"ack range {first}..{last} ends before it starts")
        if last - first >= 1_000_000:
            raise InvalidArgumentError(f"ack range {first}..{last} spans more than 1,000,000 offsets")
        pairs.append((first, last))
        named += last - first + 1
    return pairs, named


class BatchLaneService(pb_grpc.BatchLaneServicer):
    def __init__(self, broker: BrokerService) -> None:
        self._broker = broker
        self._schema = broker.schema_gate  # danube.schema.validation.SchemaGate
        self._publish_nowait = broker.publish_nowait  # the per-call publish path
        # In-stream acks of every Consume stream, applied once per consumer and loop turn.
        self._acks = AckBatcher(self._apply_acks)
        self._repartition = None  # danube.routing.repartition.runtime.RepartitionRuntime (version fence)
        if broker.metadata is not None:
            from danube.routing.repartition import runtime as repartition_runtime

            self._repartition = repartition_runtime.for_broker(broker)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                self._repartition.start()

    # ------------------------------------------------------------ producers

    async def _create_producer(self, spec: pb.ProducerSpec) -> int:
        if spec.access_mode not in _ACCESS_MODES:
            raise InvalidArgumentError(f"unknown producer access mode {spec.access_mode}")
        if not spec.producer_name:
            raise InvalidArgumentError("producer_name must not be empty")
        if spec.schema_subject and self._schema is not None:  # as Danube's CreateProducer with schema_ref
            await self._schema.on_create_producer(spec.topic, spec.schema_subject)
        return await self._broker.create_producer(
            spec.topic,
            spec.producer_name,
            access_mode=_ACCESS_MODES[spec.access_mode],
            reliable=spec.reliable,
        )

    async def CreateProducer(self, request, context):
        try:
            producer_id = await self._create_producer(request)
        except DanubeError as exc:
            await _abort(context, exc)
        return pb.CreateProducerResponse(producer_id=producer_id)

    async def _publish_one(self, request: pb.PublishRequest, created: dict) -> pb.PublishAck:
        ack = pb.PublishAck(sequence=request.sequence)
        try:
            which = request.WhichOneof("producer")
            if which == "create":
                spec = request.create
                key = (spec.topic, spec.producer_name, spec.access_mode, spec.reliable)
                producer_id = created.get(key)
                if producer_id is None:
                    producer_id = created[key] = await self._create_producer(spec)
            elif which == "producer_id":
                producer_id = request.producer_id
            else:
                raise InvalidArgumentError("publish request names no producer (producer_id or create)")
            ack.producer_id = producer_id
            buf = _validate_frames(request.frames)
            if self._schema is not None and self._schema.active:
                await self._check_schema(producer_id, request, buf)
            version = request.partitioning_version if request.HasField("partitioning_version") else None
            if version is not None and self._repartition is not None:  # docs/repartition.md: the fence
                first, last = await self._publish_fenced(producer_id, buf, version)
            else:
                first, last = await self._broker.publish(producer_id, buf, partitioning_version=version)
            ack.first_offset = first
            ack.last_offset = last
            ack.count = last - first + 1
        except DanubeError as exc:
            ack.status.CopyFrom(_batch_status(exc))
        except Exception as exc:  # noqa: BLE001 - a bug fails this batch, not the stream
            log.exception("publish of batch %d failed", request.sequence)
            ack.status.CopyFrom(_batch_status(exc))
        return ack

    async def _producer_topic(self, producer_id: int) -> str | None:
        """The producer's topic; a producer not loaded yet (broker restart) is loaded to learn it."""
        topic = self._broker.producer_topic(producer_id)
        if topic is None:
            await self._broker.producer(producer_id)
            topic = self._broker.producer_topic(producer_id)
        return topic

    async def _publish_fenced(self, producer_id: int, buf: bytearray, version: int) -> tuple[int, int]:
        """A batch routed under partitioning ``version``: refused (StaleRoutingError, nothing stored)
        when its partition's version is newer; one dict lookup per batch otherwise."""
        name = await self._producer_topic(producer_id)
        repartition = cast("RepartitionRuntime", self._repartition)  # Publish calls this only with one
        epoch = await repartition.admit(name, version) if name is not None else None
        if epoch is None:
            return await self._broker.publish(producer_id, buf, partitioning_version=version)
        try:
            first, last = await self._broker.publish(producer_id, buf, partitioning_version=version)
            repartition.fence.stored(cast(str, name), epoch, first)  # an epoch is admitted for a name
            return first, last
        finally:
            epoch.done()

    async def _check_schema(self, producer_id: int, request: pb.PublishRequest, buf: bytearray) -> None:
        """The topic's schema policy for one batch (docs/schema-registry.md): ids once per batch,
        payloads one by one only when the topic validates payloads."""
        topic = await self._producer_topic(producer_id)
        if topic is not None:
            cast("SchemaGate", self._schema).check_batch(  # Publish calls this only with an active gate
                topic,
                request.schema_id if request.HasField("schema_id") else None,
                request.schema_version if request.HasField("schema_version") else None,
                buf,
            )

    def _publish_now(self, request: pb.PublishRequest) -> pb.PublishAck | asyncio.Future | None:
        """The per-call path: a batch naming a loaded producer, with no schema check and no
        partitioning version, is validated and appended in the reader's turn; returns the future
        of its durability, or its ack when it was refused (nothing stored).  None when the batch
        needs the general path (``_publish_one`` in a task)."""
        publish_nowait = self._publish_nowait
        if (
            publish_nowait is None
            or request.WhichOneof("producer") != "producer_id"
            or request.HasField("partitioning_version")
            or (self._schema is not None and self._schema.active)
        ):
            return None
        try:
            return publish_nowait(request.producer_id, _validate_frames(request.frames))
        except Exception as exc:  # noqa: BLE001 - refused (or a bug): this batch, not the stream
            if not isinstance(exc, DanubeError):
                log.exception("publish of batch %d failed", request.sequence)
            ack = pb.PublishAck(sequence=request.sequence, producer_id=request.producer_id)
            ack.status.CopyFrom(_batch_status(exc))
            return ack

    async def Publish(self, request_iterator, context) -> AsyncIterator[pb.PublishAck]:
        """Reads batches and stores several at once; each ack goes out when its batch is durable.

        Batches are handed to the broker in arrival order: on the per-call path each is
        appended as it is read; a batch that needs a task (a producer to create or load, a
        schema or partitioning check) is read only after the tasks before it, which start in
        the order they were created, and the per-call path waits while such tasks are pending.
        On the native server an ack of the per-call path is written by the callback that
        learns its batch is durable (``write_nowait``) while this handler is not writing.
        """
        acks: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        created: dict = {}
        tasks: set[asyncio.Task] = set()
        reading_done = object()
        # batches read and not answered yet; the future the reader waits on for room (or the end)
        state: list = [0, None]
        encoded = getattr(context, "sends_encoded", False)
        write_nowait = getattr(context, "write_nowait", None)
        idle = [False]  # this handler waits for an ack to send (is not in the middle of a write)

        def settle() -> None:
            state[0] -= 1
            waiter = state[1]
            if waiter is not None:
                wake(waiter)

        def answer(ack) -> None:
            if not (idle[0] and write_nowait is not None and acks.empty() and write_nowait(ack)):
                acks.put_nowait(ack)

        async def store(request):
            try:
                acks.put_nowait(await self._publish_one(request, created))
            finally:
                settle()

        def answered(sequence: int, producer_id: int, fut: asyncio.Future) -> None:
            try:
                if fut.cancelled():
                    return  # the broker is stopping: as a cancelled store, no ack
                exc = fut.exception()
                if exc is None:
                    first, last = fut.result()
                    if encoded:
                        answer(_encoded_ack(sequence, producer_id, first, last))
                    else:
                        answer(
                            pb.PublishAck(
                                sequence=sequence,
                                producer_id=producer_id,
                                first_offset=first,
                                last_offset=last,
                                count=last - first + 1,
                            )
                        )
                    return
                if not isinstance(exc, DanubeError):
                    log.error("publish of batch %d failed", sequence, exc_info=exc)
                ack = pb.PublishAck(sequence=sequence, producer_id=producer_id)
                ack.status.CopyFrom(_batch_status(exc))
                answer(ack)
            finally:
                settle()

        async def at_most(limit: int) -> None:
            while state[0] > limit:
                state[1] = loop.create_future()
                try:
                    await state[1]
                finally:
                    state[1] = None

        async def read_requests():
            try:
                async for request in request_iterator:
                    if state[0] >= MAX_STREAM_IN_FLIGHT:
                        await at_most(MAX_STREAM_IN_FLIGHT - 1)
                    state[0] += 1
                    now = None if tasks else self._publish_now(request)
                    if now is None:
                        task = asyncio.ensure_future(store(request))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    elif type(now) is pb.PublishAck:
                        acks.put_nowait(now)
                        settle()
                    else:
                        now.add_done_callback(functools.partial(answered, request.sequence, request.producer_id))
                await at_most(0)
            finally:
                acks.put_nowait(reading_done)

        reader = asyncio.ensure_future(read_requests())
        try:
            while True:
                idle[0] = True
                try:
                    item = await acks.get()
                finally:
                    idle[0] = False
                if item is reading_done:
                    break
                yield item
            await reader  # surfaces a broken request stream
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    # ------------------------------------------------------------ consumers

    async def _subscribe(self, spec: pb.SubscribeSpec) -> int:
        if spec.subscription_type not in _SUB_TYPES:
            raise InvalidArgumentError(f"unknown subscription type {spec.subscription_type}")
        if not spec.subscription:
            raise InvalidArgumentError("subscription must not be empty")
        if not spec.consumer_name:
            raise InvalidArgumentError("consumer_name must not be empty")
        return await self._broker.subscribe(
            spec.topic,
            spec.subscription,
            spec.consumer_name,
            sub_type=_SUB_TYPES[spec.subscription_type],
            key_filters=tuple(spec.key_filters),
            # reliable set = create the topic with that dispatch if missing; unset = it must exist
            reliable=spec.reliable if spec.HasField("reliable") else None,
            initial_position="earliest" if spec.initial_position == pb.EARLIEST else "latest",
        )

    async def _ack(self, consumer_id: int, ranges) -> int:
        """Acks whole ranges (no work per offset); returns how many offsets the request named."""
        pairs, named = _ack_pairs(ranges)
        if pairs:
            await self._broker.ack_ranges(consumer_id, pairs)
        return named

    def _apply_acks(self, consumer_id: int, ranges: list[tuple[int, int]]) -> None:
        if self._broker.ack_ranges_now(consumer_id, ranges) is None:
            # not loaded here yet (a restart): loading it awaits the metadata store
            raise _NotLoaded()

    async def _ack_loading(self, consumer_id: int, pairs: list[tuple[int, int]]) -> None:
        await self._broker.ack_ranges(consumer_id, pairs)

    async def _nack(self, consumer_id: int, request: pb.NackRequest) -> None:
        await self._broker.nack(
            consumer_id,
            request.offset,
            delay_ms=request.delay_ms if request.HasField("delay_ms") else None,
            reason=request.reason if request.HasField("reason") else None,
        )

    async def Ack(self, request, context):
        try:
            acked = await self._ack(request.consumer_id, request.ranges)
        except DanubeError as exc:
            await _abort(context, exc)
        return pb.AckResponse(acked=acked)

    async def Nack(self, request, context):
        try:
            await self._nack(request.consumer_id, request)
        except DanubeError as exc:
            await _abort(context, exc)
        return pb.NackResponse()

    async def Consume(self, request_iterator, context) -> AsyncIterator[pb.ConsumeResponse | Encoded]:
        """First request subscribes (or names a consumer id); then credits, acks and nacks.

        Batches are sent while the client has message and byte credit left.  When the
        client half-closes, pending acks and nacks are applied and the stream ends.
        """
        requests = request_iterator.__aiter__()
        try:
            first = await requests.__anext__()
        except StopAsyncIteration:
            return
        kind = first.WhichOneof("kind")
        try:
            if kind == "subscribe":
                consumer_id = await self._subscribe(first.subscribe)
            elif kind == "consumer_id":
                consumer_id = first.consumer_id
                await self._broker.ack(consumer_id, ())  # attaches it, or NotFoundError
            else:
                raise InvalidArgumentError("the first Consume request must be subscribe or consumer_id")
        except DanubeError as exc:
            await _abort(context, exc)
            return
        yield pb.ConsumeResponse(subscribed=pb.Subscribed(consumer_id=consumer_id))

        # On the native server a batch goes out as its fields plus the delivered frames' own buffer
        # (shared by every stream delivering them), not as a copy per stream.
        encoded = getattr(context, "sends_encoded", False)
        credit = [0, 0]  # messages, bytes
        errors: asyncio.Queue = asyncio.Queue()
        stream_ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        # Set when the control reader has news (credit, an ack/nack error, the end of the
        # stream): a waiting receive returns empty and the loop below attends to it.  The
        # receive itself runs in this handler's task, so a delivery costs no extra task.
        interrupt: list[asyncio.Future] = [loop.create_future()]

        def poke() -> None:
            wake(interrupt[0])

        async def read_control():
            try:
                async for request in requests:
                    kind = request.WhichOneof("kind")
                    try:
                        if kind == "credit":
                            grant_was_needed = credit[0] <= 0 or credit[1] <= 0
                            credit[0] += request.credit.messages
                            credit[1] += request.credit.bytes
                            if grant_was_needed:
                                poke()
                        elif kind == "ack":
                            await self._ack(request.ack.consumer_id or consumer_id, request.ack.ranges)
                        elif kind == "nack":
                            await self._nack(request.nack.consumer_id or consumer_id, request.nack)
                        else:
                            raise InvalidArgumentError(f"unexpected {kind} request after the stream started")
                    except DanubeError as exc:
                        errors.put_nowait(_batch_status(exc))
                        poke()
            finally:
                stream_ended.set()
                poke()

        acks = self._acks
        set_sink = getattr(context, "set_message_sink", None)
        tasks: set[asyncio.Task] = set()

        def report(exc: BaseException) -> None:
            errors.put_nowait(_batch_status(exc))
            poke()

        async def awaited(coro) -> None:
            try:
                await coro
            except DanubeError as exc:
                report(exc)

        def later(coro) -> None:
            task = asyncio.ensure_future(awaited(coro))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def ack_failed(exc: BaseException, target: int, pairs: list[tuple[int, int]]) -> None:
            if isinstance(exc, _NotLoaded):
                later(self._ack_loading(target, pairs))
            elif isinstance(exc, DanubeError):
                report(exc)
            else:
                log.error("ack on consumer %d failed", target, exc_info=exc)
                report(exc)

        def control(request) -> None:
            """A control request handled in the connection's read (no task per message); acks
            join the turn's batch (``AckBatcher``)."""
            if request is grpc.aio.EOF:
                stream_ended.set()
                poke()
                return
            try:
                kind = request.WhichOneof("kind")
                if kind == "credit":
                    grant_was_needed = credit[0] <= 0 or credit[1] <= 0
                    credit[0] += request.credit.messages
                    credit[1] += request.credit.bytes
                    if grant_was_needed:
                        poke()
                elif kind == "ack":
                    target = request.ack.consumer_id or consumer_id
                    pairs, _named = _ack_pairs(request.ack.ranges)
                    if pairs and tasks:  # behind a nack still being applied: in order, after it
                        later(self._ack_loading(target, pairs))
                    elif pairs:
                        acks.add(target, pairs, ack_failed)
                elif kind == "nack":
                    target = request.nack.consumer_id or consumer_id
                    acks.flush_consumer(target)  # the acks it sent before come first
                    later(self._nack(target, request.nack))
                else:
                    raise InvalidArgumentError(f"unexpected {kind} request after the stream started")
            except DanubeError as exc:
                report(exc)
            except Exception as exc:  # noqa: BLE001 - a bug fails this request, not the connection's read
                log.exception("control request of consumer %d failed", consumer_id)
                report(exc)

        if set_sink is not None and acks is not None:
            reader = None
            set_sink(control)
        else:
            reader = asyncio.ensure_future(read_control())

        write_nowait = getattr(context, "write_nowait", None)

        def push(delivery) -> tuple[int, int] | None:
            """A fresh delivery written in the turn that made it available, while this handler
            waits in its receive (so nothing of this stream is being written); None when it must
            go the awaited way (news to attend to first, or the stream cannot take it now)."""
            if write_nowait is None or interrupt[0].done() or delivery.redelivery_counts:
                return None
            frames = delivery.frames
            count = delivery.count
            if not write_nowait(
                _encoded_batch(frames, _batch_fields(delivery.first_offset, delivery.last_offset, count))
            ):
                return None
            credit[0] -= count
            credit[1] -= len(frames)
            return credit[0], credit[1]

        pusher = push if encoded and write_nowait is not None else None
        try:
            while True:
                while not errors.empty():
                    yield pb.ConsumeResponse(error=errors.get_nowait())
                if stream_ended.is_set():
                    break  # the client half-closed: it is done with this stream
                if interrupt[0].done():
                    interrupt[0] = loop.create_future()
                if credit[0] <= 0 or credit[1] <= 0:
                    await interrupt[0]
                    continue
                try:
                    delivery = await self._broker.receive(
                        consumer_id, max_messages=credit[0], max_bytes=credit[1], interrupt=interrupt[0], push=pusher
                    )
                except DanubeError as exc:
                    await _abort(context, exc)
                    return
                if not delivery.count:
                    continue  # interrupted: errors to send, more credit, or the end of the stream
                frames = delivery.frames
                credit[0] -= delivery.count
                credit[1] -= len(frames)
                redelivered = delivery.redelivery_counts
                if encoded and not redelivered:  # a fresh delivery: no message object
                    yield _encoded_batch(
                        frames, _batch_fields(delivery.first_offset, delivery.last_offset, delivery.count)
                    )
                    continue
                batch = pb.ConsumeBatch(
                    first_offset=delivery.first_offset,
                    last_offset=delivery.last_offset,
                    count=delivery.count,
                )
                counts = redelivery_counts_in_frame_order(frames, redelivered)
                if counts:
                    batch.redelivery_counts.extend(counts)
                if encoded:
                    yield _encoded_batch(frames, batch.SerializeToString())
                else:
                    batch.frames = bytes(frames)
                    yield pb.ConsumeResponse(batch=batch)
        finally:
            if reader is not None:
                reader.cancel()
            # (nacks still being applied finish: as the reader applied them before the stream ended)
            if acks is not None:
                acks.flush_consumer(consumer_id)  # acks it sent count before it is detached
            # Unacked deliveries of this stream go back to the subscription.
            self._broker.detach(consumer_id)

    # ------------------------------------------------------------ live routing (docs/repartition.md)

    async def GetTopology(self, request, context):
        if self._repartition is None:
            return pb.Topology()
        try:
            return await self._repartition.hub.snapshot(request.topics)
        except DanubeError as exc:
            await _abort(context, exc)

    async def WatchTopology(self, request_iterator, context) -> AsyncIterator[pb.Topology]:
        """Per connection: the snapshot of the subscribed topics, then a push whenever their routing
        changes; the client acks the generation it applied (adoption tracking)."""
        if self._repartition is None:
            return
        hub = self._repartition.hub
        stream = hub.open()

        async def read_control():
            try:
                async for request in request_iterator:
                    kind = request.WhichOneof("kind")
                    if kind == "subscribe":
                        await hub.subscribe(stream, request.subscribe.topics)
                    elif kind == "ack":
                        hub.ack(stream, request.ack.generation)
            finally:
                stream.queue.put_nowait(None)

        reader = asyncio.ensure_future(read_control())
        try:
            while True:
                item = await stream.queue.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            hub.close(stream)


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> BatchLaneService:
    """Registers the batch lane on ``server`` (called by danube.server.app)."""
    service = BatchLaneService(broker)
    pb_grpc.add_BatchLaneServicer_to_server(service, server)
    return service
