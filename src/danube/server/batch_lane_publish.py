"""The batch lane's producer side (``danube.server.batch_lane``): CreateProducer and the Publish
stream, which reads batches and answers each with its ack once the batch is durable."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, cast

import grpc

from danube import _native
from danube import message_codec as frame_codec
from danube.errors import DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server import status as status_map
from danube.server.batch_lane_wire import batch_status, encoded_ack, refused_ack
from danube.server.h2grpc.frames import uint_fields
from danube.server.h2grpc.wire import Encoded

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.routing.repartition.runtime import RepartitionRuntime
    from danube.schema.validation import SchemaGate

log = logging.getLogger(__name__)

# Batches of one Publish stream being stored at once (the client's in-flight window
# normally keeps below this; beyond it the stream stops reading, which pushes back).
MAX_STREAM_IN_FLIGHT = 64

_ACCESS_MODES = {pb.SHARED: "shared", pb.EXCLUSIVE: "exclusive"}
_PublishAck = pb.PublishAck
_EOF = grpc.aio.EOF
check_batch = frame_codec.check_batch
_CheckedFrames = frame_codec.CheckedFrames
# Publish's request deserializer (``publish_handler``): the request's fields in one call, read
# as protobuf reads them; bytes protobuf would refuse raise MalformedRequestError and the call
# ends INTERNAL, as it did with protobuf's parse
parse_request = _native.load("publish_request").parse
if TYPE_CHECKING:
    from danube._core.publish_request import PublishRequest


def publish_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The generated Publish handler with danube's own request reader as its deserializer."""
    return handler._replace(request_deserializer=parse_request)


def checked_frames(frames: bytes | bytearray, producer_id: int) -> bytearray:
    """A batch's frames checked once for the whole publish path (``message_codec.check_batch``):
    a writable copy the broker stamps in place, refused here (nothing stored) when empty or
    when a frame's length, checksum or layout is bad.  Frames ``parse_request`` checked for
    this producer already are that copy."""
    checked: Any = frames
    if type(checked) is _CheckedFrames and checked.producer_id == producer_id:
        return checked
    if not frames:
        raise InvalidArgumentError("empty batch: a publish request needs at least one frame")
    return check_batch(frames, producer_id)


def _message_ack(sequence: int, producer_id: int, first: int, last: int) -> pb.PublishAck:
    return _PublishAck(
        sequence=sequence, producer_id=producer_id, first_offset=first, last_offset=last, count=last - first + 1
    )


class PublishLane:
    """A base class of :class:`~danube.server.batch_lane.BatchLaneService`, which holds the state."""

    if TYPE_CHECKING:
        _broker: BrokerService
        _schema: SchemaGate | None
        # (producer id, frames, answer, tag): ``answer(tag, producer_id, first, last, error)`` once
        # it is committed or failed; None: the producer is not loaded here (the awaited path)
        _publish_nowait: Callable[..., object] | None
        _repartition: RepartitionRuntime | None

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
            await status_map.abort(context, exc)
        return pb.CreateProducerResponse(producer_id=producer_id)

    async def _publish_one(self, request: PublishRequest, created: dict) -> pb.PublishAck:
        ack = pb.PublishAck(sequence=request.sequence)
        try:
            spec = request.create
            if spec is not None:
                key = (spec.topic, spec.producer_name, spec.access_mode, spec.reliable)
                producer_id = created.get(key)
                if producer_id is None:
                    producer_id = created[key] = await self._create_producer(spec)
            elif request.producer_id is not None:
                producer_id = request.producer_id
            else:
                raise InvalidArgumentError("publish request names no producer (producer_id or create)")
            ack.producer_id = producer_id
            buf = checked_frames(request.frames, producer_id)
            if self._schema is not None and self._schema.active:
                await self._check_schema(producer_id, request, buf)
            version = request.partitioning_version
            if version is not None and self._repartition is not None:  # docs/repartition.md: the fence
                first, last = await self._publish_fenced(producer_id, buf, version)
            else:
                first, last = await self._broker.publish(producer_id, buf, partitioning_version=version)
            ack.first_offset = first
            ack.last_offset = last
            ack.count = last - first + 1
        except DanubeError as exc:
            ack.status.CopyFrom(batch_status(exc))
        except Exception as exc:  # noqa: BLE001 - a bug fails this batch, not the stream
            log.exception("publish of batch %d failed", request.sequence)
            ack.status.CopyFrom(batch_status(exc))
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

    async def _check_schema(self, producer_id: int, request: PublishRequest, buf: bytearray) -> None:
        """The topic's schema policy for one batch (docs/schema-registry.md): ids once per batch,
        payloads one by one only when the topic validates payloads."""
        topic = await self._producer_topic(producer_id)
        if topic is not None:
            cast("SchemaGate", self._schema).check_batch(  # Publish calls this only with an active gate
                topic,
                request.schema_id,
                request.schema_version,
                buf,
            )

    async def Publish(self, request_iterator, context) -> AsyncIterator[pb.PublishAck]:
        """Reads batches and stores several at once; each ack goes out when its batch is durable.

        Batches are handed to the broker in arrival order: on the per-call path each is
        appended as it is read; a batch that needs a task (a producer to create or load, a
        schema or partitioning check) is read only after the tasks before it, which start in
        the order they were created, and the per-call path waits while such tasks are pending.
        On the native server an ack of the per-call path is written by the callback that
        learns its batch is durable (``write_nowait``) while this handler is not writing, and
        batches are taken by a message sink in the connection's read (no task woken per
        batch), which pauses while ``MAX_STREAM_IN_FLIGHT`` batches are being stored.
        """
        loop = asyncio.get_running_loop()
        answers: deque = deque()  # acks for this handler to send, in order, then ``reading_done``
        reading_done = object()
        created: dict = {}
        tasks: set[asyncio.Task] = set()
        make_ack = encoded_ack if getattr(context, "sends_encoded", False) else _message_ack
        write_nowait = getattr(context, "write_nowait", None)
        # the native server's: an ack is a message of uint64 fields, encoded and framed at once
        write_fields = getattr(context, "write_fields_nowait", None)
        publish_nowait = self._publish_nowait
        schema = self._schema
        in_flight = 0  # batches read and not answered yet
        room: asyncio.Future | None = None  # the reader's, while it waits for in_flight to drop
        # the native server's call hands batches to a sink that can pause (grpc.aio's cannot);
        # the sink is installed through the request iterator, so a wrapper that must see every
        # request (the auth guard's per-message permission check) checks what it hands over
        take_by_sink = getattr(request_iterator, "take_by_sink", None)
        by_sink = take_by_sink is not None and all(
            hasattr(context, name) for name in ("pause_messages", "resume_messages")
        )
        paused = False  # the sink's: MAX_STREAM_IN_FLIGHT batches are being stored
        sink_ended = False  # the sink got the end of the request stream
        idle: asyncio.Future | None = None  # this handler's, while it waits for an answer (not writing)

        def queue(ack) -> None:
            answers.append(ack)
            if idle is not None and not idle.done():
                idle.set_result(None)

        def settle() -> None:
            nonlocal in_flight, paused
            in_flight -= 1
            if room is not None and not room.done():
                room.set_result(None)
            if paused and in_flight < MAX_STREAM_IN_FLIGHT:
                paused = False
                context.resume_messages()
            elif sink_ended and not in_flight:
                queue(reading_done)

        def answered(sequence: int, producer_id: int, first: int, last: int, exc: BaseException | None) -> None:
            nonlocal in_flight, paused
            try:
                if exc is None:
                    if write_fields is None:
                        ack = make_ack(sequence, producer_id, first, last)
                    else:
                        # PublishAck's fields 1-5 in order (test_batch_lane_publish checks the bytes)
                        fields = (sequence, producer_id, first, last, last - first + 1)
                        if idle is not None and not answers and write_fields(fields):
                            return
                        ack = Encoded((uint_fields(fields),))
                else:
                    if isinstance(exc, asyncio.CancelledError):
                        return  # the broker is stopping: as a cancelled store, no ack
                    if not isinstance(exc, DanubeError):
                        log.error("publish of batch %d failed", sequence, exc_info=exc)
                    ack = refused_ack(sequence, producer_id, exc)
                # written now while the handler waits with nothing queued before it; else in turn
                if idle is None or answers or write_nowait is None or not write_nowait(ack):
                    queue(ack)
            finally:
                # (``settle``, inline: every answer's path)
                in_flight -= 1
                if room is not None and not room.done():
                    room.set_result(None)
                if paused and in_flight < MAX_STREAM_IN_FLIGHT:
                    paused = False
                    context.resume_messages()
                elif sink_ended and not in_flight:
                    queue(reading_done)

        async def store(request):
            try:
                queue(await self._publish_one(request, created))
            finally:
                settle()

        async def at_most(limit: int) -> None:
            nonlocal room
            while in_flight > limit:
                room = loop.create_future()
                try:
                    await room
                finally:
                    room = None

        def take(request) -> None:
            """A batch read (by the iterator, or handed over in the connection's read when this is
            the message sink); cannot raise.  The per-call path: a batch naming a loaded producer,
            with no schema check and no partitioning version and no task before it, is validated
            and appended now, its ack written when the broker's commit answers it (or at
            once when it is refused, nothing stored); any other batch goes to ``store`` in a task."""
            nonlocal in_flight, paused, sink_ended
            if request is _EOF:  # only the sink gets it
                sink_ended = True
                if not in_flight:
                    queue(reading_done)
                return
            in_flight += 1
            producer_id = request.producer_id
            if (
                producer_id is None
                or tasks
                or publish_nowait is None
                or request.partitioning_version is not None
                or (schema is not None and schema.active)
            ):
                now = None
            else:
                try:
                    frames = request.frames
                    if type(frames) is not _CheckedFrames:  # (checked by ``parse_request`` unless bad)
                        if not frames:
                            raise InvalidArgumentError("empty batch: a publish request needs at least one frame")
                        frames = check_batch(frames, producer_id)  # raises what is wrong
                    # checked once, stamped in place; ``answered`` is called once it is durable
                    now = publish_nowait(producer_id, frames, answered, request.sequence)
                except Exception as exc:  # noqa: BLE001 - refused (or a bug): this batch, not the stream
                    if not isinstance(exc, DanubeError):
                        log.exception("publish of batch %d failed", request.sequence)
                    queue(refused_ack(request.sequence, producer_id, exc))
                    settle()
                    return
            if now is None:  # a producer to create or load, a check that awaits: in turn, in a task
                task = asyncio.ensure_future(store(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if by_sink and in_flight >= MAX_STREAM_IN_FLIGHT and not paused:
                paused = True
                context.pause_messages()

        async def read_requests():
            try:
                async for request in request_iterator:
                    if in_flight >= MAX_STREAM_IN_FLIGHT:
                        await at_most(MAX_STREAM_IN_FLIGHT - 1)
                    take(request)
                await at_most(0)
            finally:
                queue(reading_done)

        if by_sink and take_by_sink is not None:
            reader = None
            take_by_sink(take)
        else:
            reader = asyncio.ensure_future(read_requests())
        try:
            while True:
                while not answers:
                    idle = loop.create_future()
                    try:
                        await idle
                    finally:
                        idle = None
                item = answers.popleft()
                if item is reading_done:
                    break
                yield item
            if reader is not None:
                await reader  # surfaces a broken request stream
        finally:
            if reader is not None:
                reader.cancel()
            for task in list(tasks):
                task.cancel()
