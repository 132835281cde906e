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

One partition's stream, credit and acks live in ``consumer_stream.py``, the inbox the streams
deliver into in ``consumer_inbox.py``; the builder and the consumer that merges the partitions
are here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import AsyncIterator, Iterable

from danube.client.connection import Connections, RetryState
from danube.client.consumer_inbox import TIMEOUT, Inbox
from danube.client.consumer_stream import END, SUB_TYPES, PartitionConsumer
from danube.client.consumer_stream import offset_ranges as offset_ranges  # re-exported: part of this module's API
from danube.client.messages import Message, MessageBatch
from danube.errors import ClientError, InvalidArgumentError

log = logging.getLogger(__name__)


class SubType:
    """Subscription types (names as in Danube's clients)."""

    Exclusive = "exclusive"
    Shared = "shared"
    Failover = "failover"
    KeyShared = "key_shared"


# Acks wait this long for the ones after them, so a consumer that gets a small batch every few
# milliseconds writes one ack request per ten or more of them (each request is a gRPC write here
# and a read and an ack pass on the broker); as long as Pulsar's default ack grouping, and far
# below any ack timeout (30 s by default).  Sooner when they cover a quarter of the receive credit.
DEFAULT_ACK_LINGER_MS = 100.0
MAX_ACK_LINGER_MS = 1000.0


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
        if value not in SUB_TYPES:
            raise InvalidArgumentError(f"subscription type must be one of {sorted(SUB_TYPES)}, not {sub_type!r}")
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
        self._parts: list[PartitionConsumer] = []
        self._queue = Inbox()
        self._error: BaseException | None = None
        # Messages of a batch the message iterator started but the application stopped reading
        # (``break`` out of ``async for``): the next iteration continues with them.
        self._pending: deque[Message] = deque()
        # Batches handed to the application whose credit has not gone back yet: it goes back when the
        # application asks for the next batch (receive_batch, or the message iterator past the batch's
        # last message), after the acks it queued meanwhile.  So what the broker delivered and has no
        # ack for stays within the receive credit (the redelivery bound of a move), not the credit
        # plus the batch the application is working through.
        self._held: list[PartitionConsumer] = []  # their ``taken`` credit goes back at the next ask
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
        parts = [PartitionConsumer(self, i, name) for i, name in enumerate(names)]
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
                part = PartitionConsumer(self, len(self._parts), f"{self.topic}-part-{len(self._parts)}")
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

    def deliver(self, batch: MessageBatch) -> None:
        self._queue.put_nowait(batch)

    def deliver_error(self, error: BaseException) -> None:
        self._error = error
        self._queue.put_nowait(END)

    # ------------------------------------------------------------ reading

    async def receive_batch(self, timeout: float | None = None) -> MessageBatch | None:
        """The next batch; ``None`` after ``timeout`` seconds without one.

        Messages the message iterator took from a batch but did not yield yet stay with it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._give_back()
        while True:
            if not self._queue.empty():
                item = self._queue.get_nowait()
            elif deadline is None:
                item = await self._queue.get()
            else:
                item = await self._queue.get(max(0.0, deadline - loop.time()))
                if item is TIMEOUT:
                    return None
            if item is END:
                self._queue.put_nowait(END)
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            batch = self._accept(item)
            if batch is not None:
                return batch

    def receive_ready(self) -> list[MessageBatch] | None:
        """Every batch delivered and not taken yet, without waiting (``[]`` when there is none);
        ``None`` once the consumer is closed; raises the error that ended it.

        Like ``receive_batch``, the call means the application is done with the batches it took
        before: their credit goes back."""
        if self._held:
            self._give_back()
        queue = self._queue
        items = queue.items
        taken: list[MessageBatch] = []
        while items:
            item = items.popleft()
            if item is END:
                queue.put_back(END)  # stays: every later call ends too
                if taken:
                    return taken
                if self._error is not None:
                    raise self._error
                return None
            batch = self._accept(item)
            if batch is not None:
                taken.append(batch)
        return taken

    def _give_back(self) -> None:
        """The application is done with the batches it took before: the streams that delivered
        them get their credit back (a new stream forgets what its predecessor's batches held)."""
        held = self._held
        if held:
            self._held = []
            for part in held:
                taken = part.taken
                if taken[0]:
                    owed = part.owed  # part.grant(*taken) inline: sent once half a window is owed
                    owed[0] += taken[0]
                    owed[1] += taken[1]
                    if 2 * owed[0] >= self.receive_messages or 2 * owed[1] >= self.receive_bytes:
                        part.send_credit()
                    taken[0] = taken[1] = 0

    def _accept(self, item: MessageBatch) -> MessageBatch | None:
        """A delivered batch as the application gets it (held until it asks for more), without the
        redeliveries of what it acked already; None when nothing is left of it."""
        part = self._parts[item._partition] if item._partition < len(self._parts) else None
        if part is None:
            return item
        first = item.first_offset
        if first > part.acked.highest and item.last_offset - first + 1 == item.count:
            rest: MessageBatch | None = item  # unseen()'s usual case, inline: fresh and contiguous
        else:
            rest = part.unseen(item)
        if rest is None:  # every message was already acked (and acked again): its credit goes back now
            if item._stream == part.stream:
                part.grant(item.count, len(item.frames))
            return None
        if item._stream == part.stream:  # credit of an older stream is void on the current one
            taken = part.taken
            taken[0] += item.count
            taken[1] += len(item.frames)
            self._held.append(part)
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

    def _partition_of(self, item) -> PartitionConsumer:
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
        parts = self._parts
        if not parts:
            raise ClientError("consumer not subscribed")
        part = parts[batch._partition]
        first, last = batch.first_offset, batch.last_offset
        if last - first + 1 == batch.count:
            part.acked.add_range(first, last)  # part.ack_range(first, last) inline
            part._outbox.ack(first, last)
        else:
            part.ack(batch.offsets())

    async def nack(self, message: Message, *, delay_ms: int | None = None, reason: str | None = None) -> None:
        self._partition_of(message).nack(message.offset, delay_ms, reason)

    async def flush(self) -> None:
        """Sends the acks and nacks that linger now and returns once every partition's stream has
        written what was queued (a stream that breaks meanwhile writes it on its successor);
        raises ``ClientError`` if the consumer closes or gives up first."""
        await asyncio.gather(*(p.flush() for p in self._parts))

    async def close(self) -> None:
        if self._listening:
            self._listening = False
            self.client.topology().cache.unlisten(self.topic, self._on_route)
        if self._growing is not None:
            self._growing.cancel()
        parts = self._parts
        await asyncio.gather(*(p.close() for p in parts), return_exceptions=True)
        self._queue.put_nowait(END)

    async def __aenter__(self) -> "Consumer":
        return await self.subscribe()

    async def __aexit__(self, *exc) -> None:
        await self.close()
