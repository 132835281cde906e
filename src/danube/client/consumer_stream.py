"""One partition's consuming: its ``Consume`` stream, its credit, its acks, its re-subscribes.

The stream half of the consumer (``danube.client.consumer`` is the facade that merges the
partitions into one iterator and follows a repartition).  A partition grants the receive credit
up front and gives it back as the application finishes batches, sends acks (grouped into offset
ranges, lingering briefly so several batches' acks travel together) and nacks on the same stream,
drops redeliveries of what was already acked, and when the stream breaks with a retriable status
or the broker answers ``CLOSE`` to the health check, looks the topic up again and re-subscribes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Iterable

import grpc

from danube.client.acked import AckedOffsets
from danube.client.connection import BrokerConnection, RetryState, cancelled_call_error, retrying
from danube.client.consumer_outbox import END, Outbox
from danube.client.errors import from_batch_status, is_retriable
from danube.client.h2.reading import batch_reader
from danube.client.health import CONSUMER, HealthWatch
from danube.client.messages import MessageBatch
from danube.errors import ClientError, DanubeError
from danube.proto.danube_batch import batch_pb2 as pb

if TYPE_CHECKING:
    from danube.client.consumer import Consumer

log = logging.getLogger(__name__)

SUB_TYPES = {
    "exclusive": pb.EXCLUSIVE_SUBSCRIPTION,
    "shared": pb.SHARED_SUBSCRIPTION,
    "failover": pb.FAILOVER_SUBSCRIPTION,
    "key_shared": pb.KEY_SHARED_SUBSCRIPTION,
}


def merged_ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, merged ``(first, last)`` pairs covering ``offsets``."""
    ranges: list[tuple[int, int]] = []
    first = last = -2
    for offset in sorted(set(offsets)):
        if offset == last + 1:
            last = offset
            continue
        if first >= 0:
            ranges.append((first, last))
        first = last = offset
    if first >= 0:
        ranges.append((first, last))
    return ranges


def offset_ranges(offsets: Iterable[int]) -> list[pb.OffsetRange]:
    """Sorted, merged ``[first, last]`` ranges covering ``offsets``."""
    return [pb.OffsetRange(first=first, last=last) for first, last in merged_ranges(offsets)]


class PartitionConsumer:
    def __init__(self, owner: "Consumer", index: int, topic: str) -> None:
        self.owner = owner
        self.index = index
        self.topic = topic
        self.consumer_id = -1
        # a run of acks covering a quarter of the receive window goes out without waiting for the linger
        self._outbox = Outbox(owner.ack_linger_s, max(1, owner.receive_messages // 4))
        self.owed = [0, 0]  # credit (messages, bytes) the application is done with, not yet granted
        # credit (messages, bytes) of this stream's batches the application took and is working on
        self.taken = [0, 0]
        self._subscribed = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._conn: BrokerConnection | None = None
        self._call = None
        self._stream_subscribed = False  # the current stream got its Subscribed answer
        self._health: HealthWatch | None = None
        self._retry = RetryState(owner.client.retry)
        self.acked = AckedOffsets()
        self.stream = 0  # number of the current Consume stream
        self.resubscribes = 0  # times the consumer re-subscribed (for tests and stats)
        self._closed_error: ClientError | None = None  # set once no writer will come again

    def spec(self) -> pb.SubscribeSpec:
        o = self.owner
        return pb.SubscribeSpec(
            topic=self.topic,
            subscription=o.subscription,
            consumer_name=o.name,
            subscription_type=SUB_TYPES[o.sub_type],
            key_filters=list(o.key_filters),
            reliable=o.reliable,
            initial_position=pb.EARLIEST if o.initial_position == "earliest" else pb.LATEST,
        )  # None leaves the field unset: no topic creation

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        await self._subscribed
        self._health = self.owner.client.watch_health(
            CONSUMER,
            lambda: (self._conn, self.consumer_id if self._stream_subscribed else -1),
            self._on_health_close,
            what=f"consumer {self.owner.name} on {self.topic}",
        )

    def _on_health_close(self) -> None:
        call = self._call
        if call is not None and not self._closing:
            log.info("consumer %s on %s follows its topic: re-subscribing", self.owner.name, self.topic)
            call.cancel()  # _run sees the cancelled stream and re-subscribes

    def grant(self, messages: int, nbytes: int) -> None:
        """Give credit back for a batch the application took.

        Grants are held until half of either window is owed, then sent as one: the broker
        always keeps at least half of the window, and the stream carries one credit request
        per several batches instead of one per batch (each request is a gRPC write on both
        sides)."""
        owed = self.owed
        owed[0] += messages
        owed[1] += nbytes
        o = self.owner
        if 2 * owed[0] >= o.receive_messages or 2 * owed[1] >= o.receive_bytes:
            self.send_credit()

    def send_credit(self) -> None:
        """The credit owed, in one request (Consumer._give_back adds to ``owed`` as grant does)."""
        owed = self.owed
        self._outbox.push(pb.ConsumeRequest(credit=pb.Credit(messages=owed[0], bytes=owed[1])))
        owed[0] = owed[1] = 0

    def ack(self, offsets: Iterable[int]) -> None:
        add, outbox = self.acked.add_range, self._outbox
        for first, last in merged_ranges(offsets):
            add(first, last)
            outbox.ack(first, last)

    def ack_range(self, first: int, last: int) -> None:
        self.acked.add_range(first, last)
        self._outbox.ack(first, last)

    def unseen(self, batch: MessageBatch) -> MessageBatch | None:
        """``batch`` without redeliveries of messages already acked (those are acked again)."""
        acked = self.acked
        if batch.first_offset > acked.highest and batch.last_offset - batch.first_offset + 1 == batch.count:
            return batch  # fresh and contiguous: the usual case, no decoding
        rest, skipped = batch.without(acked)
        if skipped:
            log.debug("dropping %d redelivered message(s) of %s already acked", len(skipped), self.topic)
            for first, last in merged_ranges(skipped):
                self._outbox.ack(first, last)
        return rest

    async def flush(self) -> None:
        if self._closed_error is not None:
            raise self._closed_error
        await self._outbox.flush()

    def nack(self, offset: int, delay_ms: int | None, reason: str | None) -> None:
        request = pb.NackRequest(consumer_id=0, offset=offset)
        if delay_ms is not None:
            request.delay_ms = delay_ms
        if reason is not None:
            request.reason = reason
        self._outbox.push(pb.ConsumeRequest(nack=request))

    async def _run(self) -> None:
        """Keeps one Consume stream open; re-subscribes after retriable failures."""
        try:
            await retrying(
                self._consume,
                self._retry,
                what=f"consume stream of {self.topic}",
                should_retry=self._should_retry,
                give_up=self._gave_up,
            )
        except DanubeError as error:
            if self._closing:
                return
            if not self._subscribed.done():
                # never subscribed: start() raises it to its caller, the consumer's other partitions go on
                self._subscribed.set_exception(error)
                return
            health, self._health = self._health, None
            self.owner.client.unwatch_nowait(health)
            self._stop_writing(ClientError(f"consumer {self.owner.name} on {self.topic} gave up: {error}"))
            self.owner.deliver_error(error)

    async def _consume(self) -> None:
        """One attempt: look the topic up and subscribe on a new stream; returns once closing."""
        if self._closing:
            return
        conn = await self.owner.client.lookup(self.topic)
        try:
            await self._stream(conn)
        except asyncio.CancelledError:
            if self._closing:
                raise
            # The health check cancelled the call (CLOSE): re-subscribe.
            raise cancelled_call_error("consume stream closed by the broker") from None
        if not self._closing:
            raise ClientError("consume stream ended", retriable=True)

    def _should_retry(self, cause: BaseException) -> bool:
        if self._closing:
            return False
        if is_retriable(cause):
            return True
        if isinstance(cause, grpc.aio.AioRpcError):
            code = cause.code()
            return code == grpc.StatusCode.CANCELLED or (code == grpc.StatusCode.NOT_FOUND and self._stream_subscribed)
        return False

    def _gave_up(self, error: DanubeError) -> DanubeError:
        gave_up = ClientError(
            f"consumer {self.owner.name} on {self.topic} gave up re-subscribing after "
            f"{self._retry.describe()}; last error: {error}"
        )
        gave_up.__cause__ = error
        return gave_up

    async def _stream(self, conn: BrokerConnection) -> None:
        owner = self.owner
        # What a broken stream did not write (acks, nacks) goes out on this one; it starts with the whole window.
        self._outbox.restart(
            pb.ConsumeRequest(credit=pb.Credit(messages=owner.receive_messages, bytes=owner.receive_bytes))
        )
        self.owed = [0, 0]
        self.taken = [0, 0]
        self.stream += 1
        stream = self.stream
        self._stream_subscribed = False
        self._conn = conn
        lane = conn.open_consume_lane()
        # Written with call.write() by a task of ours rather than through a request iterator: no
        # async generator and no queue between the acks and the write.
        call = lane.batch_lane.Consume()
        self._call = call
        writer = asyncio.ensure_future(self._write(call))
        topic, index = self.topic, self.index

        def take(responses: list) -> None:
            """Deliveries, the subscription's answer and ack errors, in order."""
            deliver = owner.deliver  # looked up per read: a wrapped or overridden deliver sees every batch
            for response in responses:
                kind = response.WhichOneof("kind")
                if kind == "batch":
                    b = response.batch
                    counts = b.redelivery_counts
                    deliver(
                        MessageBatch(
                            topic,
                            index,
                            b.frames,
                            b.first_offset,
                            b.last_offset,
                            b.count,
                            list(counts) if counts else None,
                            stream,
                        )
                    )
                elif kind == "subscribed":
                    self.consumer_id = response.subscribed.consumer_id
                    self._stream_subscribed = True
                    self._retry.reset()
                    if stream > 1:
                        self.resubscribes += 1
                    if not self._subscribed.done():
                        self._subscribed.set_result(self.consumer_id)
                elif kind == "error":
                    e = response.error
                    log.warning(
                        "ack/nack on %s failed: %s", self.topic, from_batch_status(e.code, e.message, e.retriable)
                    )

        try:
            read_responses = batch_reader(call)
            if hasattr(call, "on_messages"):  # the h2 transport's call: taken as they arrive
                call.on_messages = take
            while responses := await read_responses():  # with on_messages: until the call ends
                take(responses)
        finally:
            self._call = None
            conn.close_consume_lane(lane)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _write(self, call) -> None:
        """The stream's requests: subscribe, then what the outbox releases; half-closes at END."""
        outbox = self._outbox
        try:
            await call.write(pb.ConsumeRequest(subscribe=self.spec()))
            outbox.direct = getattr(call, "write_nowait", None)  # the h2 transport's call
            while True:
                request = await outbox.next()
                if request is None:
                    await call.done_writing()
                    return
                await call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            # The call ended: its reader sees why (and re-subscribes); what was not written stays queued.
            log.debug("consume stream of %s stopped writing: %r", self.topic, exc)
        finally:
            outbox.direct = None

    async def close(self) -> None:
        self._closing = True
        health, self._health = self._health, None
        await self.owner.client.unwatch(health)
        self._outbox.push(END)
        closed = ClientError(f"consumer {self.owner.name} on {self.topic} closed before writing its acks")
        if self._task is None:
            self._stop_writing(closed)
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=2)
        except (asyncio.TimeoutError, Exception):
            pass
        if not self._task.done():
            call = getattr(self, "_call", None)
            if call is not None:
                call.cancel()
            self._task.cancel()
        self._stop_writing(closed)

    def _stop_writing(self, error: ClientError) -> None:
        """No stream will write again: flushes still waiting fail with ``error`` (later ones at once)."""
        self._closed_error = error
        self._outbox.abandon(error)
