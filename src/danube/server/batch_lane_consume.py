"""The batch lane's consumer side (``danube.server.batch_lane``): the Consume stream (subscribe,
then credits, acks and nacks in, batches out), and the unary Ack and Nack.

The Consume stream's requests are read by ``consume_request`` (``danube._core.pbwire``): an ack,
the request a stream sends per delivery, comes as an ``AckRequest`` (its ranges already
``(first, last)`` pairs, read from the bytes in one C walk); any other kind as protobuf's
``ConsumeRequest``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, AsyncIterator

import grpc
from google.protobuf.message import DecodeError

from danube import _native
from danube._tasks import wake
from danube.errors import DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb
from danube.server import status as status_map
from danube.server.batch_lane_wire import (
    ack_pairs,
    batch_status,
    check_ack_range,
    consume_batch_as,
    encoded_batch,
    encoded_delivery,
    redelivery_counts_in_frame_order,
)
from danube.server.h2grpc.wire import Encoded

if TYPE_CHECKING:
    from danube.broker.acks import AckBatcher
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)

_pbwire = _native.load("pbwire")
# The Consume call's request deserializer (``batch_lane.add_to_server``): an ack as an AckRequest.
consume_request = _pbwire.consume_request
AckRequest = _pbwire.AckRequest

_SUB_TYPES = {
    pb.EXCLUSIVE_SUBSCRIPTION: "exclusive",
    pb.SHARED_SUBSCRIPTION: "shared",
    pb.FAILOVER_SUBSCRIPTION: "failover",
    pb.KEY_SHARED_SUBSCRIPTION: "key_shared",
}


def checked_pairs(request) -> list[tuple[int, int]]:
    """An ``AckRequest``'s ranges, or the ``InvalidArgumentError`` ``ack_pairs`` raises for the
    first range it refuses."""
    for first, last in request.ranges:
        check_ack_range(first, last)
    return request.ranges


class _NotLoaded(Exception):
    """An ack for a consumer not loaded here yet: it takes the awaited path."""


class ConsumeLane:
    """A base class of :class:`~danube.server.batch_lane.BatchLaneService`, which holds the state."""

    if TYPE_CHECKING:
        _broker: BrokerService
        _acks: AckBatcher

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
        pairs, named = ack_pairs(ranges)
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
            await status_map.abort(context, exc)
        return pb.AckResponse(acked=acked)

    async def Nack(self, request, context):
        try:
            await self._nack(request.consumer_id, request)
        except DanubeError as exc:
            await status_map.abort(context, exc)
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
        except DecodeError as exc:  # (grpcio: see read_control)
            await context.abort(grpc.StatusCode.INTERNAL, f"cannot parse the request of Consume: {exc}")
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
            await status_map.abort(context, exc)
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

        def grant(more: pb.Credit) -> None:
            grant_was_needed = credit[0] <= 0 or credit[1] <= 0
            credit[0] += more.messages
            credit[1] += more.bytes
            if grant_was_needed:
                poke()

        unreadable: list[Exception] = []  # a request its deserializer refused (grpcio hands that to us)

        async def read_control():
            try:
                async for request in requests:
                    kind = request.WhichOneof("kind")
                    try:
                        if kind == "credit":
                            grant(request.credit)
                        elif kind == "ack":
                            if type(request) is AckRequest:
                                pairs = checked_pairs(request)
                                if pairs:
                                    await self._broker.ack_ranges(request.consumer_id or consumer_id, pairs)
                            else:
                                await self._ack(request.ack.consumer_id or consumer_id, request.ack.ranges)
                        elif kind == "nack":
                            await self._nack(request.nack.consumer_id or consumer_id, request.nack)
                        else:
                            raise InvalidArgumentError(f"unexpected {kind} request after the stream started")
                    except DanubeError as exc:
                        errors.put_nowait(batch_status(exc))
                        poke()
            except DecodeError as exc:
                # The native server ends such a call INTERNAL before the handler sees the bytes;
                # grpcio raises the deserializer's error here: end it the same way, not as a clean end
                unreadable.append(exc)
            finally:
                stream_ended.set()
                poke()

        acks = self._acks
        # a sink bypasses the request iterator, so only when that is the call's own: a wrapper (the
        # auth guard's check of an ack or nack naming another consumer) must see every request
        set_sink = (
            getattr(context, "set_message_sink", None) if getattr(request_iterator, "call", None) is context else None
        )
        tasks: set[asyncio.Task] = set()

        def report(exc: BaseException) -> None:
            errors.put_nowait(batch_status(exc))
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
                if type(request) is AckRequest:  # (the most frequent: one per delivery)
                    target = request.consumer_id or consumer_id
                    pairs = request.ranges if request.checked else checked_pairs(request)
                    if pairs and tasks:  # behind a nack still being applied: in order, after it
                        later(self._ack_loading(target, pairs))
                    elif pairs:
                        acks.add(target, pairs, ack_failed)
                    return
                kind = request.WhichOneof("kind")
                if kind == "ack":  # (a request not read by consume_request)
                    ack = request.ack
                    target = ack.consumer_id or consumer_id
                    ranges = ack.ranges
                    if len(ranges) == 1:  # (``ack_pairs``' usual case inline: no call per ack)
                        r = ranges[0]
                        first, last = r.first, r.last
                        pairs = [(first, last)] if 0 <= last - first < 1_000_000 else ack_pairs(ranges)[0]
                    else:
                        pairs = ack_pairs(ranges)[0]
                    if pairs and tasks:  # behind a nack still being applied: in order, after it
                        later(self._ack_loading(target, pairs))
                    elif pairs:
                        acks.add(target, pairs, ack_failed)
                elif kind == "credit":
                    grant(request.credit)
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
        pusher = None
        if encoded and write_nowait is not None:
            write = write_nowait

            def push(frames, first: int, last: int, count: int) -> tuple[int, int] | None:
                """A fresh delivery written in the turn that made it available, while this handler
                waits in its receive (so nothing of this stream is being written); None when it must
                go the awaited way (news to attend to first, or the stream cannot take it now)."""
                if interrupt[0].done():
                    return None
                # (``encoded_delivery`` inline: one C call, no Python frame per delivery)
                if not write(consume_batch_as(Encoded, frames, first, last, count)):
                    return None
                messages = credit[0] - count
                nbytes = credit[1] - len(frames)
                credit[0] = messages
                credit[1] = nbytes
                return messages, nbytes

            pusher = push
        try:
            while True:
                while not errors.empty():
                    yield pb.ConsumeResponse(error=errors.get_nowait())
                if stream_ended.is_set():
                    if unreadable:
                        await context.abort(
                            grpc.StatusCode.INTERNAL, f"cannot parse the request of Consume: {unreadable[0]}"
                        )
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
                    await status_map.abort(context, exc)
                    return
                if not delivery.count:
                    continue  # interrupted: errors to send, more credit, or the end of the stream
                frames = delivery.frames
                credit[0] -= delivery.count
                credit[1] -= len(frames)
                redelivered = delivery.redelivery_counts
                if encoded and not redelivered:  # a fresh delivery: no message object
                    yield encoded_delivery(frames, delivery.first_offset, delivery.last_offset, delivery.count)
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
                    yield encoded_batch(frames, batch.SerializeToString())
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
