"""One partition's publishing: its open batch, its ``Publish`` stream, its unacked batches.

The stream-with-retry half of the producer (``danube.client.producer`` is the facade that routes
messages to partitions and switches routing on a repartition). A partition collects messages into
an open batch, seals it at ``max_batch_bytes`` or after ``linger_ms``, keeps at most
``max_in_flight`` requests awaiting their ack, two when they are small (a request carries the
batches queued behind its first, ``producer_queue.py``), and when the stream breaks (or the broker moves the
topic) drains it, re-creates the producer and resends the unacked batches in order.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from danube import message_codec as frame_codec
from danube.client.connection import BrokerConnection, RetryState, cancelled_call_error, retrying
from danube.client.errors import from_batch_status, is_retriable
from danube.client.h2.reading import batch_reader
from danube.client.health import PRODUCER, HealthWatch
from danube.client.producer_batch import FRAME_OVERHEAD, Batch
from danube.client.producer_queue import SendQueue, Window, coalesce
from danube.errors import ClientError, DanubeError
from danube.proto.danube_batch import batch_pb2 as pb

if TYPE_CHECKING:
    from danube.client.producer import Producer

log = logging.getLogger(__name__)

ACCESS_MODES = {"shared": pb.SHARED, "exclusive": pb.EXCLUSIVE}

# Ends a Publish request stream (put on the send queue by close()).
_STOP = object()
# Wakes the request generator so it notices the stream is draining.
_WAKE = object()


# Requests of less than a quarter of max_batch_bytes in flight at once (at most max_in_flight).
SMALL_REQUESTS_IN_FLIGHT = 2

# How long a draining stream may take to answer its in-flight batches before it is cancelled.
DRAIN_TIMEOUT_S = 10.0

# Batch statuses after which the producer follows its topic (re-lookup, re-create, resend).
_FOLLOW_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND})


def _follows_topic(error: BaseException) -> bool:
    return getattr(error, "grpc_code", None) in _FOLLOW_CODES


class PartitionProducer:
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
        self._unacked: dict[int, Batch] = {}  # sequence -> batch, in send order
        self._to_send = SendQueue()  # (sequence, batch), _STOP or _WAKE
        self._window = Window(owner.max_in_flight)
        # A plain flag beside the event, kept equal to is_set(): the send and ack paths of every
        # message test the flag (an attribute read) instead of calling is_set(), and set or clear
        # the event only when the flag changes.  Both are always changed together.
        self._space = asyncio.Event()
        self._space.set()
        self.has_space = True
        # Idle is "nothing unacked"; only a flush (or a cutover) waits for it, so the waiters are
        # woken when the last batch is acked rather than an event set and cleared for every batch
        # (each a Python call: a producer of one message per call goes idle after every ack).
        self._idle_waiters: list[asyncio.Future] = []
        self._task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self._closing = False
        self._conn: BrokerConnection | None = None
        self._call: Any = None  # the Publish call (grpc.aio's or the h2 transport's)
        self._streaming = False  # a Publish stream is open (a reconnect may be requested)
        self._draining = False  # that stream takes no new batches; it ends after its acks
        self._drain_reason: BaseException | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self._retry = RetryState(owner.client.retry)
        self._stream_broke = False  # the next attempt re-creates the producer first
        self._health: HealthWatch | None = None
        # while a stream whose call can write without waiting is open: writes a batch at once
        # when the writer has nothing else to do (see _enqueue)
        self._write_now: Any = None
        self.reconnects = 0  # times the producer re-created itself (for tests and stats)

    # ------------------------------------------------------------ lifecycle

    async def create(self, conn: BrokerConnection) -> None:
        spec = pb.ProducerSpec(
            topic=self.topic,
            producer_name=self.owner.name,
            access_mode=ACCESS_MODES[self.owner.access_mode],
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
        if not self.has_space:
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

    def add_batch_nowait(
        self, payloads: Sequence, key: str | None, attributes: Mapping[str, str] | None
    ) -> asyncio.Future | None:
        """``payloads`` as one batch when they fit in one and the window has room: a future of
        their offsets (a list); None when ``add_batch`` must chunk them or wait."""
        if self._failure is not None or self._closing:
            self._check_usable()
        if not payloads or not self.has_space:
            return None
        if sum(map(len, payloads)) + len(payloads) * FRAME_OVERHEAD >= self.owner.max_batch_bytes:
            return None
        if self._payloads or self._linger_handle is not None:
            self.seal()
        fut = self._loop.create_future()
        attrs = dict(attributes) if attributes else None
        self._enqueue(Batch(list(payloads), None, None, None, fut, key, attrs, True))
        return fut

    async def add_batch(
        self, payloads: Sequence, key: str | None, attributes: Mapping[str, str] | None
    ) -> list[asyncio.Future]:
        """Chunks ``payloads`` into batches of at most max_batch_bytes; one future per chunk."""
        self._check_usable()
        self.seal()
        limit = self.owner.max_batch_bytes
        if sum(map(len, payloads)) + len(payloads) * FRAME_OVERHEAD < limit:  # one chunk: no per-message loop
            return [await self._enqueue_chunk(payloads, key, attributes)] if payloads else []
        done = []
        start, size = 0, 0
        for i, p in enumerate(payloads):
            size += len(p) + FRAME_OVERHEAD
            if size >= limit:
                done.append(await self._enqueue_chunk(payloads[start : i + 1], key, attributes))
                start, size = i + 1, 0
        if start < len(payloads):
            done.append(await self._enqueue_chunk(payloads[start:], key, attributes))
        return done

    async def _enqueue_chunk(self, payloads, key, attributes) -> asyncio.Future:
        if not self.has_space:
            await self._space.wait()
            self._check_usable()
        fut = self._loop.create_future()
        self._enqueue(Batch(list(payloads), done=fut, key=key, attrs=dict(attributes) if attributes else None))
        return fut

    def seal(self) -> None:
        if self._linger_handle is not None:
            self._linger_handle.cancel()
            self._linger_handle = None
        if not self._payloads:
            return
        if self._has_meta:
            batch = Batch(self._payloads, self._keys, self._attributes, self._futures)
        else:
            batch = Batch(self._payloads, futures=self._futures)
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
        self._open_bytes += len(payload) + FRAME_OVERHEAD

    def take_unsent(self) -> list[tuple[int, Batch]]:
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

    def _enqueue(self, batch: Batch) -> None:
        batch.version = self.owner.partitioning_version
        seq = next(self._sequence)
        self._unacked[seq] = batch
        write_now = self._write_now
        # The writer waits for the queue with everything before written: a batch the windows have
        # room for is written here, without waking the writer task (at a thousand producers of one
        # small batch each, that wake-up was a good part of a message's cost); else it is queued.
        # (SendQueue.idle() inline: the writer waits for an item and none is queued.)
        to_send = self._to_send
        waiter = to_send._waiter
        if write_now is None or waiter is None or waiter.done() or to_send._items or not write_now(seq, batch):
            to_send.put_nowait((seq, batch))
        if len(self._unacked) >= 2 * self.owner.max_in_flight:
            self.has_space = False
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
        self._to_send = SendQueue()
        for seq in sorted(self._unacked):
            self._to_send.put_nowait((seq, self._unacked[seq]))
        self._window = Window(self.owner.max_in_flight)

    async def _stream(self) -> None:
        to_send = self._to_send
        window = self._window
        producer_id = self.producer_id
        unacked = self._unacked
        schema = self.owner.schema  # (schema id, version, frame attributes) or None
        schema_attrs = None if schema is None else schema[2]
        limit = self.owner.max_batch_bytes
        small = limit // 4
        listeners = self.owner.ack_listeners  # the list itself: listeners added later are seen
        # the requests that carry several batches: request sequence -> [(batch sequence, messages)]
        merged: dict[int, list[tuple[int, int]]] = {}

        encode_payloads = frame_codec.encode_payloads
        wall_clock = time.time

        def encode(batch: Batch) -> bytes:
            return batch.encode(producer_id, schema_attrs)

        def request_for(seq: int, batch: Batch, frames: bytes) -> pb.PublishRequest:
            if schema is None:
                request = pb.PublishRequest(sequence=seq, producer_id=producer_id, frames=frames)
            else:
                request = pb.PublishRequest(
                    sequence=seq,
                    producer_id=producer_id,
                    schema_id=schema[0],
                    schema_version=schema[1],
                    frames=frames,
                )
            if batch.version is not None:
                request.partitioning_version = batch.version
            return request

        def write_now(seq: int, batch: Batch) -> bool:
            """The writer's turn for one batch, done here when nothing has to wait: True once it
            is written; False (nothing done) when the writer must take it."""
            if self._draining:
                return False
            if batch.keys is None and schema_attrs is None:  # Batch.encode's send_batch case, inline
                frames = batch.frames = encode_payloads(
                    batch.payloads,
                    publish_time=int(wall_clock() * 1000),
                    producer_id=producer_id,
                    key=batch.key,
                    attributes=batch.attrs,
                )
                batch.encoded_for = producer_id
            else:
                frames = batch.encode(producer_id, schema_attrs)
            in_flight = window.size - window.free
            if window.free <= 0 or (len(frames) < small and in_flight >= SMALL_REQUESTS_IN_FLIGHT):
                return False
            if schema is None and batch.version is None:  # request_for's usual case, inline
                request = pb.PublishRequest(sequence=seq, producer_id=producer_id, frames=frames)
            else:
                request = request_for(seq, batch, frames)
            if not call.write_nowait(request):
                return False
            window.free -= 1
            batch.sent_at = time.perf_counter()
            return True

        async def write_requests() -> None:
            # call.write() from this task rather than a request iterator: one coroutine less
            # between the queue and the gRPC write of every request
            try:
                while True:
                    item = await to_send.get()
                    if item is _STOP or self._draining:
                        break
                    if item is _WAKE:
                        continue
                    seq, batch = item
                    if len(encode(batch)) < small:
                        # acks of small requests would queue behind each other in the client
                        # (grpc reads one message per event-loop round trip); the batches
                        # queued meanwhile go out merged into the next request instead
                        await window.below(SMALL_REQUESTS_IN_FLIGHT)
                    await window.acquire()
                    if self._draining:
                        break
                    if seq not in unacked:  # acked meanwhile by an earlier stream
                        window.release()
                        continue
                    frames, members = coalesce(seq, batch, to_send, unacked, encode, limit)
                    if members is not None:
                        merged[seq] = members
                    await call.write(request_for(seq, batch, frames))
                await call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return  # the call ended: its status reaches the reading side
            except Exception:  # noqa: BLE001 - as a failing request iterator: the call is cancelled
                log.exception("publish stream of %s: writing a request failed", self.topic)
                call.cancel()

        def take_acks(acks: list) -> None:
            """Settles the batches of the acks that arrived (in order)."""
            retry = self._retry
            for ack in acks:
                # window.release() inline
                window.free += 1
                waiter = window._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                sequence = ack.sequence
                members = merged.pop(sequence, None) if merged else None
                if members is None:
                    batch = unacked.get(sequence)
                    if batch is None:
                        continue
                    if ack.HasField("status") and ack.status.code != 0:
                        if not self._refused_or_failed([(sequence, batch)], ack.status):
                            continue
                    else:
                        del unacked[sequence]
                        if not retry.fresh:
                            retry.reset()
                        first, last = ack.first_offset, ack.last_offset
                        if listeners:
                            self.owner.on_ack(batch, first, last)
                        done = batch.done
                        if batch.futures is None and done is not None:  # batch.resolve()'s send_batch case
                            if not done.done():
                                done.set_result(list(range(first, last + 1)) if batch.offsets else (first, last))
                        else:
                            batch.resolve(first, last)
                elif ack.HasField("status") and ack.status.code != 0:
                    batches = [(seq, unacked[seq]) for seq, _ in members if seq in unacked]
                    if not batches or not self._refused_or_failed(batches, ack.status):
                        continue
                else:
                    first = ack.first_offset
                    settled = False
                    for seq, count in members:
                        batch = unacked.pop(seq, None)
                        if batch is not None:
                            settled = True
                            if listeners:
                                self.owner.on_ack(batch, first, first + count - 1)
                            batch.resolve(first, first + count - 1)
                        first += count
                    if not settled:  # every one acked meanwhile by an earlier stream
                        continue
                    retry.reset()
                # _after_ack() inline
                if not self.has_space and len(unacked) < 2 * self.owner.max_in_flight:
                    self.has_space = True
                    self._space.set()
                if not unacked and self._idle_waiters:
                    self._wake_idle()
                if self._closing and not unacked and self._to_send.empty():
                    to_send.put_nowait(_STOP)

        self._draining = False
        self._drain_reason = None
        assert self._conn is not None, "created before streaming"
        call = self._conn.batch_lane.Publish()
        self._call = call
        self._streaming = True
        writer = asyncio.ensure_future(write_requests())
        if getattr(call, "write_nowait", None) is not None:  # the h2 transport's call
            self._write_now = write_now
        try:
            read_acks = batch_reader(call)
            if hasattr(call, "on_messages"):  # the h2 transport's call: acks taken as they arrive
                call.on_messages = take_acks
            while acks := await read_acks():  # with on_messages: until the call ends
                take_acks(acks)
        except asyncio.CancelledError:
            raise cancelled_call_error(f"publish stream of {self.topic} was cancelled by the client") from None
        finally:
            self._write_now = None
            if not writer.done():
                writer.cancel()
            self._call = None
            self._streaming = False
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
        if self._draining:
            raise self._drain_reason or ClientError("publish stream drained for a reconnect", retriable=True)
        if unacked and not self._closing:
            raise ClientError("publish stream ended with unacked batches", retriable=True)

    def _refused_or_failed(self, batches: list[tuple[int, Batch]], status) -> bool:
        """A request answered with an error status, for its batches (in order); False when they
        stay unacked for a reconnect (nothing settled)."""
        if status.partitions and not self._closing:
            # routed under a stale partitioning version: nothing was stored; the producer
            # routes its messages again under the new version
            for seq, batch in batches:
                del self._unacked[seq]
                self.owner.refused(self, seq, batch, status)
            return True
        error = from_batch_status(status.code, status.message, status.retriable)
        if (_follows_topic(error) or error.retriable) and not self._closing:
            # the batches stay unacked: resent after the budget's backoff and a re-create
            # (a full WAL disk, RESOURCE_EXHAUSTED, may be freed meanwhile); they fail only
            # once the retry budget is spent
            self.request_reconnect(error)
            return False
        for seq, batch in batches:
            del self._unacked[seq]
            batch.fail(error)
        return True

    def _after_ack(self) -> None:
        if not self.has_space and len(self._unacked) < 2 * self.owner.max_in_flight:
            self.has_space = True
            self._space.set()
        if not self._unacked and self._idle_waiters:
            self._wake_idle()

    def _wake_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_idle(self) -> None:
        """Until every batch enqueued is acked or failed (batches still open are not counted)."""
        if self._unacked:  # woken once idle, as an event's wait: batches enqueued meanwhile do not count
            waiter = self._loop.create_future()
            self._idle_waiters.append(waiter)
            await waiter

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
        self.has_space = True
        self._space.set()
        self._wake_idle()

    async def flush(self) -> None:
        self.seal()
        await self.wait_idle()
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
