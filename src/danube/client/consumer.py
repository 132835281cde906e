"""The batch-lane consumer: credit-based streams, one per partition, merged into one iterator.

Each partition has one bidirectional ``Consume`` stream.  The consumer grants
``receive_messages`` / ``receive_bytes`` of credit up front and gives a batch's
credit back once the application is done with it (it asks for the next batch),
so at most that much is delivered and not yet finished per partition.  Acks
and nacks travel on the same stream (acks grouped into offset ranges).  A
stream that breaks with a retriable status is reopened after a fresh lookup
with the same subscription; the broker redelivers what was not acked.

The consumer follows its topic like Danube's clients: when the broker answers
``CLOSE`` to the health check, or the stream ends or fails with
``UNAVAILABLE`` / ``NOT_FOUND`` (consumer unknown there) after it was
subscribed, the consumer looks the topic up again and re-subscribes with the
same consumer name and subscription, so delivery resumes at the persisted
cursor.  Messages delivered but not acked may come again (at-least-once);
redeliveries of messages the application already acked are dropped (and acked
again) using :class:`danube.client.acked.AckedOffsets`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import AsyncIterator, Iterable

import grpc

from danube._tasks import wake
from danube.client.acked import AckedOffsets
from danube.client.connection import BrokerConnection, Connections, RetryState, cancelled_call_error, retrying
from danube.client.errors import from_batch_status, is_retriable
from danube.client.health import CONSUMER, HealthWatch
from danube.client.messages import Message, MessageBatch
from danube.errors import ClientError, DanubeError, InvalidArgumentError
from danube.proto.danube_batch import batch_pb2 as pb

log = logging.getLogger(__name__)


class SubType:
    """Subscription types (names as in Danube's clients)."""

    Exclusive = "exclusive"
    Shared = "shared"
    Failover = "failover"
    KeyShared = "key_shared"


_SUB_TYPES = {
    "exclusive": pb.EXCLUSIVE_SUBSCRIPTION,
    "shared": pb.SHARED_SUBSCRIPTION,
    "failover": pb.FAILOVER_SUBSCRIPTION,
    "key_shared": pb.KEY_SHARED_SUBSCRIPTION,
}

_END = object()
# Acks wait this long for the ones after them; the broker then reads one request for several batches.
DEFAULT_ACK_LINGER_MS = 5.0
MAX_ACK_LINGER_MS = 1000.0


class _Inbox:
    """Delivered batches waiting for the application (bounded by the credit, so unbounded here).

    Waiter futures and a timer instead of ``asyncio.wait_for(queue.get())``, which
    creates a task for every call that has to wait."""

    __slots__ = ("_items", "_waiters")

    def __init__(self) -> None:
        self._items: deque = deque()
        self._waiters: deque[asyncio.Future] = deque()

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item) -> None:
        self._items.append(item)
        self._wake_next()

    def get_nowait(self):
        return self._items.popleft()

    async def get(self, timeout: float | None = None):
        """The next item; ``_TIMEOUT`` once ``timeout`` seconds passed without one."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._items:
            if deadline is not None and loop.time() >= deadline:
                return _TIMEOUT
            waiter = loop.create_future()
            self._waiters.append(waiter)
            timer = None if deadline is None else loop.call_at(deadline, wake, waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and self._items:
                    self._wake_next()  # this waiter was woken for an item it will not take
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                if not waiter.done():
                    waiter.cancel()
                # _wake_next pops the waiter it wakes, a timeout or a cancellation does not; a failed
                # deque.remove would format the future's repr into its ValueError on every wake-up
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self._items.popleft()

    def _wake_next(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


_TIMEOUT = object()


def offset_ranges(offsets: Iterable[int]) -> list[pb.OffsetRange]:
    """Sorted, merged ``[first, last]`` ranges covering ``offsets``."""
    ranges: list[pb.OffsetRange] = []
    first = last = None
    for offset in sorted(set(offsets)):
        if last is not None and offset == last + 1:
            last = offset
            continue
        if first is not None:
            ranges.append(pb.OffsetRange(first=first, last=last))
        first = last = offset
    if first is not None:
        ranges.append(pb.OffsetRange(first=first, last=last))
    return ranges


class ConsumerBuilder:
    def __init__(self, client: Connections) -> None:
        self._client = client
        self._topic: str | None = None
        self._name: str | None = None
        self._subscription: str | None = None
        self._sub_type = SubType.Exclusive
        self._key_filters: tuple[str, ...] = ()
        self._reliable: bool | None = None  # None: the topic must exist (NOT_FOUND otherwise)
        self._receive_messages = 10_000
        self._receive_bytes = 4 * 1024 * 1024
        self._ack_linger_ms = DEFAULT_ACK_LINGER_MS
        self._initial_position = "latest"

    def with_topic(self, topic: str) -> "ConsumerBuilder":
        self._topic = topic
        return self

    def with_consumer_name(self, name: str) -> "ConsumerBuilder":
        self._name = name
        return self

    def with_subscription(self, subscription: str) -> "ConsumerBuilder":
        self._subscription = subscription
        return self

    def with_subscription_type(self, sub_type: str) -> "ConsumerBuilder":
        value = str(sub_type).lower().replace("-", "_")
        if value == "keyshared":
            value = "key_shared"
        if value not in _SUB_TYPES:
            raise InvalidArgumentError(f"subscription type must be one of {sorted(_SUB_TYPES)}, not {sub_type!r}")
        self._sub_type = value
        return self

    def with_key_filters(self, filters: Iterable[str]) -> "ConsumerBuilder":
        self._key_filters = tuple(filters)
        return self

    def with_reliable(self, reliable: bool = True) -> "ConsumerBuilder":
        """Create the topic with this dispatch strategy if it does not exist yet (without this
        call, subscribing to a missing topic fails with NotFoundError)."""
        self._reliable = bool(reliable)
        return self

    def with_initial_position(self, position: str) -> "ConsumerBuilder":
        """Where the subscription starts if this consumer creates it: ``latest`` (the default, as
        in Danube: only messages published from now on) or ``earliest`` (the oldest message the
        topic still holds).  An existing subscription keeps its cursor either way."""
        value = str(position).lower()
        if value not in ("latest", "earliest"):
            raise InvalidArgumentError(f"initial position must be 'latest' or 'earliest', not {position!r}")
        self._initial_position = value
        return self

    def with_receive_credit(self, messages: int, max_bytes: int) -> "ConsumerBuilder":
        """How much the broker may send ahead of the application, per partition (a batch counts
        until the application asks for the next one)."""
        if messages < 1 or max_bytes < 1:
            raise InvalidArgumentError("receive credit must be positive")
        self._receive_messages, self._receive_bytes = int(messages), int(max_bytes)
        return self

    def with_ack_linger_ms(self, linger_ms: float) -> "ConsumerBuilder":
        """How long an ack waits for the ones after it, to travel together (0: sent at once)."""
        try:
            value = float(linger_ms)
        except (TypeError, ValueError):
            value = float("nan")
        if not 0 <= value <= MAX_ACK_LINGER_MS:
            raise InvalidArgumentError(f"ack linger must be between 0 and {MAX_ACK_LINGER_MS:g} ms, not {linger_ms!r}")
        self._ack_linger_ms = value
        return self

    def build(self) -> "Consumer":
        if not self._topic:
            raise InvalidArgumentError("a consumer needs a topic (with_topic)")
        if not self._name:
            raise InvalidArgumentError("a consumer needs a name (with_consumer_name)")
        if not self._subscription:
            raise InvalidArgumentError("a consumer needs a subscription (with_subscription)")
        return Consumer(
            self._client,
            self._topic,
            self._name,
            self._subscription,
            sub_type=self._sub_type,
            key_filters=self._key_filters,
            reliable=self._reliable,
            receive_messages=self._receive_messages,
            receive_bytes=self._receive_bytes,
            ack_linger_ms=self._ack_linger_ms,
            initial_position=self._initial_position,
        )


class _PartitionConsumer:
    def __init__(self, owner: "Consumer", index: int, topic: str) -> None:
        self.owner = owner
        self.index = index
        self.topic = topic
        self.consumer_id = -1
        self._outgoing: asyncio.Queue = asyncio.Queue()
        self._owed = [0, 0]  # credit (messages, bytes) taken by the application, not yet granted
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

    def spec(self) -> pb.SubscribeSpec:
        o = self.owner
        return pb.SubscribeSpec(
            topic=self.topic,
            subscription=o.subscription,
            consumer_name=o.name,
            subscription_type=_SUB_TYPES[o.sub_type],
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
        owed = self._owed
        owed[0] += messages
        owed[1] += nbytes
        o = self.owner
        if 2 * owed[0] >= o.receive_messages or 2 * owed[1] >= o.receive_bytes:
            self._outgoing.put_nowait(pb.ConsumeRequest(credit=pb.Credit(messages=owed[0], bytes=owed[1])))
            owed[0] = owed[1] = 0

    def ack(self, offsets: Iterable[int]) -> None:
        ranges = offset_ranges(offsets)
        if ranges:
            for r in ranges:
                self.acked.add_range(r.first, r.last)
            self._outgoing.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(consumer_id=0, ranges=ranges)))

    def ack_range(self, first: int, last: int) -> None:
        self.acked.add_range(first, last)
        self._outgoing.put_nowait(
            pb.ConsumeRequest(ack=pb.AckBatch(consumer_id=0, ranges=[pb.OffsetRange(first=first, last=last)]))
        )

    def unseen(self, batch: MessageBatch) -> MessageBatch | None:
        """``batch`` without redeliveries of messages already acked (those are acked again)."""
        acked = self.acked
        if batch.first_offset > acked.highest and batch.last_offset - batch.first_offset + 1 == batch.count:
            return batch  # fresh and contiguous: the usual case, no decoding
        rest, skipped = batch.without(acked)
        if skipped:
            log.debug("dropping %d redelivered message(s) of %s already acked", len(skipped), self.topic)
            ranges = offset_ranges(skipped)
            self._outgoing.put_nowait(pb.ConsumeRequest(ack=pb.AckBatch(consumer_id=0, ranges=ranges)))
        return rest

    def nack(self, offset: int, delay_ms: int | None, reason: str | None) -> None:
        request = pb.NackRequest(consumer_id=0, offset=offset)
        if delay_ms is not None:
            request.delay_ms = delay_ms
        if reason is not None:
            request.reason = reason
        self._outgoing.put_nowait(pb.ConsumeRequest(nack=request))

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
        outgoing: asyncio.Queue = asyncio.Queue()
        # Acks and nacks not yet written by a broken stream go out on the new one.
        while not self._outgoing.empty():
            item = self._outgoing.get_nowait()
            if item is not _END and item.WhichOneof("kind") in ("ack", "nack"):
                outgoing.put_nowait(item)
        self._outgoing = outgoing
        self._owed = [0, 0]  # a new stream starts with the whole window
        outgoing.put_nowait(
            pb.ConsumeRequest(credit=pb.Credit(messages=owner.receive_messages, bytes=owner.receive_bytes))
        )

        linger = owner.ack_linger_s

        async def requests():
            yield pb.ConsumeRequest(subscribe=self.spec())
            carry = None
            while True:
                item = carry if carry is not None else await outgoing.get()
                carry = None
                if item is _END:
                    return
                if item.WhichOneof("kind") == "ack":
                    if linger and outgoing.empty():
                        # Each request is a gRPC read and an ack pass on the broker: acks of the
                        # next few batches join this one instead of following one by one.
                        try:
                            await asyncio.sleep(linger)
                        except BaseException:  # the stream ended: the next one sends this ack
                            outgoing.put_nowait(item)
                            raise
                    # Acks queued meanwhile (and while the previous write was in flight) go out as one.
                    ranges = item.ack.ranges
                    while not outgoing.empty():
                        following = outgoing.get_nowait()
                        if following is _END or following.WhichOneof("kind") != "ack":
                            carry = following
                            break
                        for r in following.ack.ranges:
                            if ranges and ranges[-1].last + 1 == r.first:
                                ranges[-1].last = r.last
                            else:
                                ranges.append(r)
                yield item

        self.stream += 1
        stream = self.stream
        self._stream_subscribed = False
        self._conn = conn
        lane = conn.open_consume_lane()
        call = lane.batch_lane.Consume(requests())
        self._call = call
        try:
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "batch":
                    b = response.batch
                    await owner.deliver(
                        MessageBatch(
                            self.topic,
                            self.index,
                            b.frames,
                            b.first_offset,
                            b.last_offset,
                            b.count,
                            list(b.redelivery_counts),
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
        finally:
            self._call = None
            conn.close_consume_lane(lane)

    async def close(self) -> None:
        self._closing = True
        health, self._health = self._health, None
        await self.owner.client.unwatch(health)
        self._outgoing.put_nowait(_END)
        if self._task is None:
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


class Consumer:
    """Consumer of a topic (all partitions of a partitioned one); ``await subscribe()`` first.

    ``async for message in consumer`` (or ``consumer.messages()``) yields messages,
    ``consumer.batches()`` yields :class:`MessageBatch` es.  Ack with ``ack``,
    ``ack_many`` or ``ack_batch``; acks are sent in the background.
    """

    def __init__(
        self,
        client: Connections,
        topic: str,
        name: str,
        subscription: str,
        *,
        sub_type: str = SubType.Exclusive,
        key_filters=(),
        reliable: bool | None = None,
        receive_messages: int = 10_000,
        receive_bytes: int = 4 * 1024 * 1024,
        ack_linger_ms: float = DEFAULT_ACK_LINGER_MS,
        initial_position: str = "latest",
    ) -> None:
        self.client = client
        self.initial_position = initial_position  # where a subscription this consumer creates starts
        self.topic = topic
        self.name = name
        self.subscription = subscription
        self.sub_type = sub_type
        self.key_filters = tuple(key_filters)
        self.reliable = reliable
        self.receive_messages = receive_messages
        self.receive_bytes = receive_bytes
        self.ack_linger_s = ack_linger_ms / 1000.0
        self._parts: list[_PartitionConsumer] = []
        self._queue = _Inbox()
        self._error: BaseException | None = None
        # Messages of a batch the message iterator started but the application stopped reading
        # (``break`` out of ``async for``): the next iteration continues with them.
        self._pending: deque[Message] = deque()
        # Batches handed to the application whose credit has not gone back yet: it goes back when the
        # application asks for the next batch (receive_batch, or the message iterator past the batch's
        # last message), after the acks it queued meanwhile.  So what the broker delivered and has no
        # ack for stays within the receive credit (the redelivery bound of a move), not the credit
        # plus the batch the application is working through.
        self._held: list[tuple[_PartitionConsumer, MessageBatch]] = []
        self._listening = False
        self._growing: asyncio.Future | None = None

    @property
    def consumer_ids(self) -> list[int]:
        return [p.consumer_id for p in self._parts]

    async def subscribe(self) -> "Consumer":
        if self._parts:
            return self
        names = await self.client.call_with_retry(
            self.topic, lambda conn: self.client.partitions(self.topic), what="topic partitions"
        )
        route = None
        if names != [self.topic]:  # partitioned: follow its live routing (a grow adds partitions)
            route = await self.client.topology().route(self.topic)
            # during a shrink the shrunk-away partitions still drain: read them too
            live = max(route.partitions, route.live_partitions) if route is not None else 0
            if live > len(names):
                names = [f"{self.topic}-part-{i}" for i in range(live)]
        parts = [_PartitionConsumer(self, i, name) for i, name in enumerate(names)]
        self._parts = parts
        try:
            await asyncio.gather(*(p.start() for p in parts))
        except BaseException:
            await self.close()
            raise
        if route is not None:
            self._listening = True
            self.client.topology().cache.listen(self.topic, self._on_route)
        return self

    def _on_route(self, topic: str, route) -> None:
        """A grow: attach to the new partitions (their subscriptions were created at offset 0 by the
        cutover, so nothing published there before is skipped).  After a shrink the retired
        partitions stay attached: their history drains and stays readable."""
        if route.partitions > len(self._parts) and self._growing is None:
            self._growing = asyncio.ensure_future(self._grow())

    async def _grow(self) -> None:
        # A partition that fails to attach is tried again (backing off) rather than given up: its
        # moved keys would otherwise never reach this consumer.
        retry = RetryState(self.client.retry)
        try:
            while True:
                route = self.client.topology().cache.routes.get(self.topic)
                if route is None or route.partitions <= len(self._parts):
                    return
                part = _PartitionConsumer(self, len(self._parts), f"{self.topic}-part-{len(self._parts)}")
                self._parts.append(part)
                try:
                    await part.start()
                    retry.reset()
                except Exception as exc:  # noqa: BLE001 - tried again, within the client's retry budget
                    self._parts.remove(part)
                    delay = retry.next_delay()
                    if delay is None:
                        self.deliver_error(exc)
                        return
                    log.warning(
                        "consumer %s could not attach to %s yet (%s); trying again in %.2f s",
                        self.name,
                        part.topic,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
        finally:
            self._growing = None

    # ------------------------------------------------------------ delivery (called by the streams)

    async def deliver(self, batch: MessageBatch) -> None:
        self._queue.put_nowait(batch)

    def deliver_error(self, error: BaseException) -> None:
        self._error = error
        self._queue.put_nowait(_END)

    # ------------------------------------------------------------ reading

    async def receive_batch(self, timeout: float | None = None) -> MessageBatch | None:
        """The next batch; ``None`` after ``timeout`` seconds without one.

        Messages the message iterator took from a batch but did not yield yet stay with it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        held, self._held = self._held, []
        for owner, taken in held:  # the application is done with what it took before
            if taken._stream == owner.stream:  # the stream that delivered it gets its credit back
                owner.grant(taken.count, len(taken.frames))
        while True:
            if not self._queue.empty():
                item = self._queue.get_nowait()
            elif deadline is None:
                item = await self._queue.get()
            else:
                item = await self._queue.get(max(0.0, deadline - loop.time()))
                if item is _TIMEOUT:
                    return None
            if item is _END:
                self._queue.put_nowait(_END)
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            part = self._parts[item._partition] if item._partition < len(self._parts) else None
            if part is None:
                return item
            rest = part.unseen(item)
            if rest is None:  # every message was already acked (and acked again): its credit goes back now
                if item._stream == part.stream:
                    part.grant(item.count, len(item.frames))
                continue  # wait for the next batch
            self._held.append((part, item))
            return rest

    async def batches(self) -> AsyncIterator[MessageBatch]:
        while True:
            try:
                batch = await self.receive_batch()
            except StopAsyncIteration:
                return
            assert batch is not None  # only a timeout gives None
            yield batch

    async def messages(self) -> AsyncIterator[Message]:
        """Messages in delivery order; leaving the loop early loses nothing (the next one resumes)."""
        pending = self._pending
        while True:
            while pending:
                yield pending.popleft()
            try:
                batch = await self.receive_batch()
            except StopAsyncIteration:
                return
            assert batch is not None  # only a timeout gives None
            pending.extend(batch.messages())

    def __aiter__(self) -> AsyncIterator[Message]:
        return self.messages()

    # ------------------------------------------------------------ acknowledgement

    def _partition_of(self, item) -> _PartitionConsumer:
        if not self._parts:
            raise ClientError("consumer not subscribed")
        return self._parts[item._partition]

    async def ack(self, message: Message) -> None:
        self._partition_of(message).ack((message.offset,))

    async def ack_many(self, messages: Iterable[Message]) -> None:
        by_part: dict[int, list[int]] = {}
        for m in messages:
            by_part.setdefault(m._partition, []).append(m.offset)
        for index, offsets in by_part.items():
            self._parts[index].ack(offsets)

    async def ack_batch(self, batch: MessageBatch) -> None:
        """Acks every message of a delivered batch (one offset range when contiguous)."""
        part = self._partition_of(batch)
        if batch.last_offset - batch.first_offset + 1 == batch.count:
            part.ack_range(batch.first_offset, batch.last_offset)
        else:
            part.ack(batch.offsets())

    async def nack(self, message: Message, *, delay_ms: int | None = None, reason: str | None = None) -> None:
        self._partition_of(message).nack(message.offset, delay_ms, reason)

    async def close(self) -> None:
        if self._listening:
            self._listening = False
            self.client.topology().cache.unlisten(self.topic, self._on_route)
        if self._growing is not None:
            self._growing.cancel()
        parts = self._parts
        await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        self._queue.put_nowait(_END)

    async def __aenter__(self) -> "Consumer":
        return await self.subscribe()

    async def __aexit__(self, *exc) -> None:
        await self.close()
