"""`danube bench`: the consumers, in a child process of their own (or in the caller's loop).

The child interpreter subscribes, says "ready", consumes until the parent tells it how many
messages were acked, and answers with the delivered count and every publish->deliver latency; the
delivered count is also kept in a shared cell for the parent's progress line.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import select
import struct
import subprocess
import sys
import tempfile
import time

from danube.cli.bench_config import STAMP, BenchConfig, bench_clients, bench_topics, connection_shares
from danube.message_codec import HEADER_SIZE as FRAME_HEADER_SIZE
from danube.message_codec import MIN_BODY as FRAME_MIN_BODY

# payload position in a frame without key or attributes: the header, then the fixed body fields
_PAYLOAD_AT = FRAME_HEADER_SIZE + FRAME_MIN_BODY
_GC_THRESHOLD = (100_000, 50, 100)  # gen-0 collections every 100k allocations instead of 700
_TARGET_POLL_S = 0.010  # how often the consumer process looks for the parent's final count
_STRUCT_FRAMES = 64  # batches up to this many frames have their stamps read by struct, larger ones by numpy


@contextlib.contextmanager
def quiet_gc():
    """Setup's objects frozen out of collections, gen 0 collected rarely; restored afterwards."""
    old = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def _loop_factory():
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return None


def build_consumers(clients, config: BenchConfig, topic: str, sub_type: str) -> list:
    topics = bench_topics(config, topic)
    return [
        clients[i % len(clients)]
        .new_consumer()
        .with_topic(topics[i % len(topics)])
        .with_consumer_name(f"bench-c{i}")
        .with_subscription("bench")
        .with_subscription_type(sub_type)
        .with_reliable(config.reliable)
        .with_receive_credit(max(10_000, 4 * config.batch_size), 16 * 1024 * 1024)
        .build()
        for i in range(config.consumers)
    ]


def stamp_reader(size: int):
    """``read(frames, count, now)``: publish->deliver of every message of a batch, or None when the
    batch is not ``count`` frames without key or attributes whose payloads are ``size`` bytes (each
    payload starts with its send time).  No Python work per message in the consumer process, which
    shares the 2 cores with the broker and the producer: a small batch's checked header fields and
    stamps come out of one precompiled ``struct`` unpack (numpy's fixed cost per call is larger
    than a few frames' worth), a large one is read as strided numpy views."""
    if size < STAMP.size:  # no stamps to read (the caller does not ask)
        return lambda frames, count, now: None
    frame_len = _PAYLOAD_AT + size
    body_len = frame_len - FRAME_HEADER_SIZE
    # One frame: body_len (u32 little-endian) at 12, flags at 32, attribute count (u16) at 34, the
    # stamp at 38: every header must name a body of this length (so the frames are exactly
    # there), with no routing key (flags 0) and no attributes, so the payload follows the fixed
    # body fields.
    frame_fields = f"12xI16xBxH2xd{size - STAMP.size}x"
    assert struct.calcsize("<" + frame_fields) == frame_len and _PAYLOAD_AT == 38
    by_count: dict[int, tuple[struct.Struct, tuple[int, ...]]] = {}
    read_many = _numpy_stamps(frame_len, body_len)

    def read(frames, count: int, now: float):
        if count < 1 or len(frames) != count * frame_len:
            return None
        if count > _STRUCT_FRAMES and read_many is not None:
            return read_many(frames, count, now)
        if count == 1:  # the many-topics shape: one message per delivery
            length, flags, attributes, stamp = one.unpack_from(frames)
            if length != body_len or flags or attributes:
                return None
            return [now - stamp]
        known = by_count.get(count)
        if known is None:
            known = by_count[count] = (struct.Struct("<" + frame_fields * count), (body_len,) * count)
        unpacker, lengths = known
        fields = unpacker.unpack_from(frames)
        if fields[0::4] != lengths or any(fields[1::4]) or any(fields[2::4]):
            return None
        return [now - stamp for stamp in fields[3::4]]

    one = struct.Struct("<" + frame_fields)
    return read


def _numpy_stamps(frame_len: int, body_len: int):
    """The stamps of a large batch as strided numpy views (None without numpy)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with the test/spark extras
        return None

    def field(frames, count: int, dtype: str, at: int):
        return numpy.ndarray((count,), dtype=dtype, buffer=frames, offset=at, strides=(frame_len,))

    def read(frames, count: int, now: float):
        if not (
            (field(frames, count, "<u4", 12) == body_len).all()
            and (field(frames, count, "u1", 32) == 0).all()
            and (field(frames, count, "<u2", 34) == 0).all()
        ):
            return None
        return now - field(frames, count, "<f8", _PAYLOAD_AT)

    return read


def flatten(samples: list) -> list[float]:
    """The per-batch sample arrays/lists as one list of floats."""
    out: list[float] = []
    for part in samples:
        out.extend(part.tolist() if hasattr(part, "tolist") else part)
    return out


def batch_samples(config: BenchConfig, read_stamps):
    """``samples(batch, now)``: the publish->deliver latencies of a batch's messages (an array or
    a list), read by ``read_stamps`` (from ``stamp_reader``) when the batch has the bench's frames
    only, else frame by frame; None when the run's messages carry no stamps."""
    from danube import message_codec as frame_codec

    if config.message_size < STAMP.size:
        return None
    decode_frame = frame_codec.decode_frame
    unpack = STAMP.unpack_from
    size = config.message_size

    def samples(batch, now: float):
        frames = batch.frames
        found = read_stamps(frames, batch.count, now)
        if found is not None:
            return found
        first, _ = decode_frame(frames, 0)
        if first.routing_key is not None or first.attributes or len(first.payload) != size:
            found = []  # a topic shared with other producers (--topic): decode every frame
            pos = 0
            for _ in range(batch.count):
                record, pos = decode_frame(frames, pos)
                if len(record.payload) == size:
                    found.append(now - unpack(record.payload)[0])
            return found
        # frames of one size only (no key, no attributes): read the stamps in place
        return [now - unpack(frames, p + _PAYLOAD_AT)[0] for p in frame_codec.frame_positions(frames)]

    return samples


async def consume(
    consumer, seen: dict, latencies: list, config: BenchConfig, finished, read_stamps, poll_s: float | None = 0.05
) -> None:
    """Receives and acks until ``finished()`` (asked after every batch, and every ``poll_s`` without
    one); one publish->deliver sample per message (``latencies`` gets one array or list of samples
    per batch).  With ``poll_s`` None it waits for batches without a timer and runs until cancelled.
    ``read_stamps`` comes from ``stamp_reader``, made during setup: its numpy import takes a good
    100 ms, which must not stall the first deliveries of the measured window."""
    perf = time.perf_counter
    samples = batch_samples(config, read_stamps)
    while True:
        batch = await consumer.receive_batch(timeout=poll_s)
        if batch is None:
            if finished():
                return
            continue
        now = perf()
        if samples is not None:
            latencies.append(samples(batch, now))
        seen["delivered"] += batch.count
        seen["last"] = now
        await consumer.ack_batch(batch)
        if poll_s is not None and finished():
            return


async def consume_all(consumers, seen: dict, latencies: list, config: BenchConfig, read_stamps) -> None:
    """``consume`` for every consumer in one task, until cancelled: one wait (a ``ConsumerSet``)
    for all of them, so the deliveries of a loop turn cost one task wake-up, not one per consumer."""
    from danube.client.consumer_set import ConsumerSet

    perf = time.perf_counter
    samples = batch_samples(config, read_stamps)
    add = latencies.append
    group = ConsumerSet(consumers)
    try:
        while True:
            ready = await group.receive()
            if not ready:
                raise RuntimeError("every consumer closed")
            now = perf()
            delivered = 0
            for consumer, batches in ready:
                for batch in batches:
                    if samples is not None:
                        add(samples(batch, now))
                    delivered += batch.count
                    await consumer.ack_batch(batch)
            seen["delivered"] += delivered
            seen["last"] = now
    finally:
        group.close()


def consumer_child(conn_fd: int, counter_fd: int) -> None:
    """Entry point of the consumer process: subscribe, say "ready", consume until told the acked count."""
    import mmap
    from multiprocessing.connection import Connection

    from danube import _allocator

    _allocator.tune()  # like every danube command's process (started with -c, not through main)

    conn = Connection(conn_fd)
    delivered = _Counter(mmap.mmap(counter_fd, 8))
    config, topic, sub_type = conn.recv()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        try:
            answer = runner.run(_consumer_child_main(conn, delivered, config, topic, sub_type))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which owns the outcome
            answer = {"error": f"consumer process: {exc!r}"}
    conn.send(answer)
    conn.close()


class _Counter:
    """One int64 in a shared mapping: the delivered count the parent's progress bar shows."""

    _CELL = struct.Struct("<q")

    def __init__(self, mapping) -> None:
        self._map = mapping

    @property
    def value(self) -> int:
        return self._CELL.unpack_from(self._map)[0]

    @value.setter
    def value(self, n: int) -> None:
        self._CELL.pack_into(self._map, 0, n)


async def _consumer_child_main(conn, delivered, config: BenchConfig, topic: str, sub_type: str) -> dict:
    clients = bench_clients(config, config.consumers, connection_shares(config)[1])
    consumers = build_consumers(clients, config, topic, sub_type)
    seen = {"delivered": 0, "last": 0.0}
    latencies: list[float] = []
    target: list = [None, 0.0]  # acked count to reach, when it was announced
    # one poll object for the run: Connection.poll() builds a selector on every call
    announced = select.poll()
    announced.register(conn.fileno(), select.POLLIN)

    def finished() -> bool:
        delivered.value = seen["delivered"]
        if target[0] is None:
            if not announced.poll(0):
                return False
            target[0], target[1] = conn.recv(), time.perf_counter()
        return seen["delivered"] >= target[0] or time.perf_counter() - target[1] > config.drain_timeout

    read_stamps = stamp_reader(config.message_size)
    try:
        await asyncio.gather(*(c.subscribe() for c in consumers))
        with quiet_gc():
            conn.send("ready")
            # One task reads every consumer, waiting for batches without timers and never asking
            # whether the run is over: another looks every 10 ms (the parent announces the count once,
            # when producing ends; a timeout per wait, or a poll of the pipe per batch, is CPU the
            # broker's two cores need).
            tasks = [asyncio.ensure_future(consume_all(consumers, seen, latencies, config, read_stamps))]
            ended: list = []  # the consuming task ends early only when it failed
            for t in tasks:
                t.add_done_callback(ended.append)
            try:
                while not ended and not finished():
                    await asyncio.sleep(_TARGET_POLL_S)
            finally:
                for t in tasks:
                    t.cancel()
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, Exception):
                    raise outcome
    finally:
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.close()
        for client in clients:
            await client.close()
    return {"delivered": seen["delivered"], "last": seen["last"], "latencies": flatten(latencies)}


class ConsumerProcess:
    """The consumers in a child interpreter (a fresh one: no fork of grpc's threads, no re-import of the
    caller's __main__), talking over a socket pair; stopped by its own handle."""

    def __init__(self, config: BenchConfig, topic: str, sub_type: str) -> None:
        import mmap
        import socket
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        counter_file = tempfile.TemporaryFile()
        counter_file.write(b"\x00" * 8)
        counter_file.flush()
        self._counter_file = counter_file
        self.delivered = _Counter(mmap.mmap(counter_file.fileno(), 8))
        fds = (theirs.fileno(), counter_file.fileno())
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from danube.cli.bench_consumers import consumer_child; consumer_child{fds}"],
            pass_fds=fds,
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send((config, topic, sub_type))

    async def _receive(self, timeout: float):
        if not await asyncio.to_thread(self._conn.poll, timeout):
            raise RuntimeError(f"the consumer process did not answer within {timeout:.0f}s")
        return self._conn.recv()

    async def ready(self, consumers: int) -> None:
        # subscribing takes a metadata write each: allow for a thousand topics on a busy machine
        answer = await self._receive(max(60.0, 0.6 * consumers))
        if answer != "ready":
            raise RuntimeError(
                answer.get("error", "the consumer process failed")
                if isinstance(answer, dict)
                else f"unexpected answer {answer!r}"
            )

    async def finish(self, acked: int, drain_timeout: float) -> dict:
        self._conn.send(acked)
        return await self._receive(drain_timeout + 30)

    def stop(self) -> None:
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._counter_file.close()
