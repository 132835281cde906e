"""`danube bench`: end-to-end throughput and latency through the batch lane.

Producers call ``send_batch``; every payload starts with the time the call was
made (``perf_counter``, 8 bytes: the moment the messages were handed to the
client, before any batching).  The consumers run in a child process of their
own (``perf_counter`` is CLOCK_MONOTONIC, one clock for every process on the
machine) so the producer's event loop and grpc writes do not delay deliveries;
they measure publish→deliver on every message they receive.  publish→ack is
measured per ``send_batch`` call, from the call until its future resolves
(batch durable).

As fast as possible (``--rate 0``) each call carries ``--batch-size`` messages.
With ``--rate`` the producer is paced smoothly: one call every ``--pace-ms``
(default 2 ms) carrying that interval's worth of messages (at most
``--batch-size``), so a rate-limited run measures latency rather than large
batches queued behind each other; the producer's in-flight window grows by the
same factor, so as many messages may be in flight as with full batches.
Both processes freeze the objects that exist after setup (``gc.freeze``) and
raise the gen-0 threshold, so collections stay short during the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field

from danube.cli._client_common import (
    EXIT_FAILED,
    EXIT_OK,
    SUBSCRIPTION_TYPES,
    non_negative_float,
    positive_int,
    run_async,
)
from danube.cli._machine import describe as describe_machine
from danube.cli._machine import observe as observe_machine
from danube.cli._process import spawned_broker
from danube.message_codec import HEADER_SIZE as FRAME_HEADER_SIZE
from danube.message_codec import MIN_BODY as FRAME_MIN_BODY
from danube.processes import cpu_seconds, thread_count

_STAMP = struct.Struct("<d")


@dataclass
class BenchConfig:
    service_url: str | None = None
    spawn_broker: bool = False
    sync: str = "interval"
    data_dir: str | None = None
    topic: str | None = None
    producers: int = 1
    consumers: int = 1
    message_size: int = 100
    batch_size: int = 1000
    rate: float = 0.0
    duration: float = 10.0
    reliable: bool = True
    subscription_type: str | None = None
    max_in_flight: int = 8
    max_batch_bytes: int = 1024 * 1024
    linger_ms: float = 1.0
    pace_ms: float = 2.0  # with a rate: one send_batch call per pace_ms (at most batch_size messages)
    progress: bool = True
    drain_timeout: float = 30.0
    consumer_process: bool = True  # consumers in a child process (False: in the bench's event loop)
    topics: int = 1  # producers and consumers spread round-robin over this many topics
    connections: int = 0  # client connections, shared round-robin (0: one per process)
    broker_pid: int | None = None  # read the broker's CPU time from /proc (set when spawned)


def bench_topics(config: BenchConfig, base: str) -> list[str]:
    """The topics of a run: ``base`` itself, or ``base-0`` .. ``base-<N-1>`` with ``--topics N``."""
    return [base] if config.topics <= 1 else [f"{base}-{i}" for i in range(config.topics)]


def _clients(config: BenchConfig, count: int, share: float) -> list:
    """Client connections for ``count`` producers or consumers: this side's ``share`` of
    ``--connections`` (one when not given), at most one per producer/consumer."""
    from danube.client import DanubeClient

    n = 1 if config.connections <= 0 else max(1, min(count, round(config.connections * share)))
    return [DanubeClient.builder().service_url(config.service_url).build() for _ in range(n)]


def _connection_shares(config: BenchConfig) -> tuple[float, float]:
    total = config.producers + config.consumers
    return config.producers / total, config.consumers / total


@dataclass
class BenchResult:
    config: dict
    sent: int = 0
    acked: int = 0
    delivered: int = 0
    elapsed_s: float = 0.0
    publish_rate: float = 0.0  # acked messages / s
    end_to_end_rate: float = 0.0  # delivered messages / s
    publish_mb_s: float = 0.0
    ack_latency_ms: dict = field(default_factory=dict)
    deliver_latency_ms: dict = field(default_factory=dict)
    calls_per_s: float = 0.0  # send_batch calls / s
    messages_per_call: int = 0
    machine: dict = field(default_factory=dict)  # load, CPU steal and pressure over the measured window
    broker_cpu_s: float | None = None  # the broker's user+system CPU over the run (with a broker pid)
    broker_cpu_us_per_msg: float | None = None  # ... per acked message
    broker_cpu_us_per_call: float | None = None  # ... per send_batch call
    broker_threads: int | None = None  # the broker's threads at the end of the run
    errors: list = field(default_factory=list)


def percentiles(samples: list[float]) -> dict:
    """p50/p90/p99/p99.9/max in milliseconds (samples in seconds)."""
    if not samples:
        return {}
    data = sorted(samples)
    n = len(data)

    def at(q: float) -> float:
        return round(data[min(n - 1, int(q * n))] * 1000, 3)

    return {
        "count": n,
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "p999": at(0.999),
        "max": round(data[-1] * 1000, 3),
        "mean": round(sum(data) / n * 1000, 3),
    }


# ------------------------------------------------------------ the workload

# payload position in a frame without key or attributes: the header, then the fixed body fields
_PAYLOAD_AT = FRAME_HEADER_SIZE + FRAME_MIN_BODY
_GC_THRESHOLD = (100_000, 50, 100)  # gen-0 collections every 100k allocations instead of 700
_TARGET_POLL_S = 0.010  # how often the consumer process looks for the parent's final count


@contextlib.contextmanager
def _quiet_gc():
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


def _build_consumers(clients, config: BenchConfig, topic: str, sub_type: str) -> list:
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


def _stamp_reader(size: int):
    """``read(frames, count, now)``: publish->deliver of every message of a batch, or None when the
    batch is not ``count`` frames without key or attributes whose payloads are ``size`` bytes (each
    payload starts with its send time).  The stamps are read as one strided numpy view: no
    per-message Python work in the consumer process, which shares the 2 cores with the broker and
    the producer.  None without numpy (the caller then reads frame by frame)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with the test/spark extras
        return lambda frames, count, now: None
    frame_len = _PAYLOAD_AT + size
    body_len = frame_len - 16

    def field(frames, count: int, dtype: str, at: int):
        return numpy.ndarray((count,), dtype=dtype, buffer=frames, offset=at, strides=(frame_len,))

    def read(frames, count: int, now: float):
        if count < 1 or len(frames) != count * frame_len:
            return None
        # Every header at i * frame_len names a body of this length (so the frames are exactly
        # there), with no routing key (flags 0) and no attributes: the payload is at 38.
        if not (
            (field(frames, count, "<u4", 12) == body_len).all()
            and (field(frames, count, "u1", 32) == 0).all()
            and (field(frames, count, "<u2", 34) == 0).all()
        ):
            return None
        return now - field(frames, count, "<f8", _PAYLOAD_AT)

    return read


def _flatten(samples: list) -> list[float]:
    """The per-batch sample arrays/lists as one list of floats."""
    out: list[float] = []
    for part in samples:
        out.extend(part.tolist() if hasattr(part, "tolist") else part)
    return out


async def _consume(consumer, seen: dict, latencies: list, config: BenchConfig, finished, read_stamps) -> None:
    """Receives and acks until ``finished()``; one publish->deliver sample per message
    (``latencies`` gets one array or list of samples per batch).  ``read_stamps`` comes from
    ``_stamp_reader``, made during setup: its numpy import takes a good 100 ms, which must not
    stall the first deliveries of the measured window."""
    from danube import message_codec as frame_codec

    decode_frame = frame_codec.decode_frame
    unpack = _STAMP.unpack_from
    perf = time.perf_counter
    stamped = config.message_size >= _STAMP.size
    size = config.message_size
    while True:
        batch = await consumer.receive_batch(timeout=0.05)
        if batch is None:
            if finished():
                return
            continue
        now = perf()
        if stamped:
            frames = batch.frames
            samples = read_stamps(frames, batch.count, now)
            if samples is None:
                first, _ = decode_frame(frames, 0)
                if first.routing_key is not None or first.attributes or len(first.payload) != size:
                    samples = []  # a topic shared with other producers (--topic): decode every frame
                    pos = 0
                    for _ in range(batch.count):
                        record, pos = decode_frame(frames, pos)
                        if len(record.payload) == size:
                            samples.append(now - unpack(record.payload)[0])
                else:  # frames of one size only (no key, no attributes): read the stamps in place
                    samples = [now - unpack(frames, p + _PAYLOAD_AT)[0] for p in frame_codec.frame_positions(frames)]
            latencies.append(samples)
        seen["delivered"] += batch.count
        seen["last"] = now
        await consumer.ack_batch(batch)
        if finished():
            return


def _consumer_child(conn_fd: int, counter_fd: int) -> None:
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
    clients = _clients(config, config.consumers, _connection_shares(config)[1])
    consumers = _build_consumers(clients, config, topic, sub_type)
    seen = {"delivered": 0, "last": 0.0}
    latencies: list[float] = []
    target: list = [None, 0.0]  # acked count to reach, when it was announced
    next_poll = [0.0]

    def finished() -> bool:
        delivered.value = seen["delivered"]
        if target[0] is None:
            # The parent announces the count once, when producing ends: a poll of the pipe (a
            # select call) after every batch is CPU the broker's two cores need, so look every 10 ms.
            now = time.perf_counter()
            if now < next_poll[0]:
                return False
            next_poll[0] = now + _TARGET_POLL_S
            if not conn.poll():
                return False
            target[0], target[1] = conn.recv(), now
        return seen["delivered"] >= target[0] or time.perf_counter() - target[1] > config.drain_timeout

    read_stamps = _stamp_reader(config.message_size)
    try:
        await asyncio.gather(*(c.subscribe() for c in consumers))
        with _quiet_gc():
            conn.send("ready")
            await asyncio.gather(*(_consume(c, seen, latencies, config, finished, read_stamps) for c in consumers))
    finally:
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.close()
        for client in clients:
            await client.close()
    return {"delivered": seen["delivered"], "last": seen["last"], "latencies": _flatten(latencies)}


class _ConsumerProcess:
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
            [sys.executable, "-c", f"from danube.cli.bench import _consumer_child; _consumer_child{fds}"], pass_fds=fds
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


def messages_per_call(config: BenchConfig) -> int:
    """--batch-size as fast as possible; with --rate, one --pace-ms interval's worth (at most --batch-size)."""
    if config.rate <= 0:
        return config.batch_size
    per_producer = config.rate / config.producers
    return max(1, min(config.batch_size, round(per_producer * max(config.pace_ms, 0.1) / 1000)))


async def run_bench(config: BenchConfig) -> BenchResult:
    """Runs the workload against ``config.service_url``; returns the measurements."""
    topic = config.topic or f"/default/bench-{uuid.uuid4().hex[:8]}"
    if config.topics > 1:  # every topic gets a producer and a consumer at least
        config.producers = max(config.producers, config.topics)
        config.consumers = max(config.consumers, config.topics)
    topics = bench_topics(config, topic)
    sub_type = config.subscription_type or ("shared" if config.consumers > len(topics) else "exclusive")
    result = BenchResult(config={**asdict(config), "topic": topic, "subscription_type": sub_type})
    per_call = messages_per_call(config)
    result.messages_per_call = per_call
    producer_share = _connection_shares(config)[0]
    clients = _clients(config, config.producers, producer_share if config.consumer_process else 1.0)
    ack_lat: list[float] = []
    deliver_lat: list[float] = []
    counts = {"sent": 0, "acked": 0, "calls": 0}
    seen = {"delivered": 0, "last": 0.0}
    producing_done = asyncio.Event()
    perf = time.perf_counter
    pad = b"\x00" * max(0, config.message_size - _STAMP.size)

    child = _ConsumerProcess(config, topic, sub_type) if config.consumer_process else None
    consumers = [] if child else _build_consumers(clients, config, topic, sub_type)
    read_stamps = None if child else _stamp_reader(config.message_size)
    # Paced calls are smaller: more of them in flight, so the messages in flight stay as many as at full size.
    in_flight = config.max_in_flight * -(-config.batch_size // per_call)
    producers = []
    for i in range(config.producers):
        producer = (
            clients[i % len(clients)]
            .new_producer()
            .with_topic(topics[i % len(topics)])
            .with_name(f"bench-p{i}")
            .with_reliable(config.reliable)
            .with_linger_ms(config.linger_ms)
            .with_max_batch_bytes(config.max_batch_bytes)
            .with_max_in_flight(in_flight)
            .build()
        )
        producers.append(producer)

    def delivered() -> int:
        return child.delivered.value if child else seen["delivered"]

    def in_process_finished() -> bool:
        return producing_done.is_set() and seen["delivered"] >= counts["acked"]

    async def produce(producer, deadline: float, per_producer_rate: float) -> None:
        window = asyncio.Semaphore(in_flight * 2)
        started = perf()
        sent = 0
        while perf() < deadline:
            t0 = perf()  # the messages are handed to the client now; everything after counts
            if config.message_size >= _STAMP.size:
                payload = _STAMP.pack(t0) + pad
            else:
                payload = b"\x00" * config.message_size
            await window.acquire()
            fut = await producer.send_batch([payload] * per_call)
            counts["sent"] += per_call
            counts["calls"] += 1
            sent += per_call

            def done(f, t0=t0, n=per_call):
                window.release()
                if f.cancelled() or f.exception() is not None:
                    if not f.cancelled():
                        result.errors.append(str(f.exception()))
                    return
                ack_lat.append(perf() - t0)
                counts["acked"] += n

            fut.add_done_callback(done)
            if per_producer_rate > 0:
                delay = started + sent / per_producer_rate - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
        await producer.flush()
        while window._value < in_flight * 2:  # every callback ran
            await asyncio.sleep(0.01)

    async def progress(deadline: float, start: float) -> None:
        if not config.progress:
            return
        from tqdm import tqdm

        with tqdm(
            total=round(config.duration, 1),
            unit="s",
            desc="bench",
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f}s {postfix}",
        ) as bar:
            last_n, last_t = 0, start
            while not producing_done.is_set():
                await asyncio.sleep(0.5)
                now = perf()
                bar.n = round(min(now, deadline) - start, 1)
                n = delivered()
                rate = (n - last_n) / (now - last_t)
                last_n, last_t = n, now
                bar.set_postfix_str(f"acked {counts['acked']:,} delivered {n:,} ({rate:,.0f} msg/s)")

    consumer_tasks: list = []
    try:
        if child:
            await child.ready(config.consumers)
        else:
            await asyncio.gather(*(c.subscribe() for c in consumers))
        await asyncio.gather(*(p.create() for p in producers))
        with _quiet_gc(), observe_machine() as result.machine:
            consumer_tasks = [
                asyncio.ensure_future(_consume(c, seen, deliver_lat, config, in_process_finished, read_stamps))
                for c in consumers
            ]
            cpu_start = cpu_seconds(config.broker_pid)
            start = perf()
            deadline = start + config.duration
            progress_task = asyncio.ensure_future(progress(deadline, start))
            per_rate = config.rate / config.producers if config.rate > 0 else 0.0
            await asyncio.gather(*(produce(p, deadline, per_rate) for p in producers))
            producing_done.set()
            produced_s = perf() - start
            if child:
                answer = await child.finish(counts["acked"], config.drain_timeout)
                if "error" in answer:
                    result.errors.append(answer["error"])
                seen["delivered"], seen["last"] = answer.get("delivered", 0), answer.get("last", 0.0)
                deliver_lat = answer.get("latencies", [])
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*consumer_tasks), config.drain_timeout)
            cpu_end = cpu_seconds(config.broker_pid)
            if seen["delivered"] < counts["acked"]:
                result.errors.append(
                    f"only {seen['delivered']} of {counts['acked']} acked messages were "
                    f"delivered within {config.drain_timeout}s"
                )
            for task in consumer_tasks:
                task.cancel()
            await asyncio.gather(*consumer_tasks, progress_task, return_exceptions=True)
        e2e_s = max(seen["last"] - start, 1e-9)
        result.sent, result.acked, result.delivered = counts["sent"], counts["acked"], seen["delivered"]
        result.elapsed_s = round(produced_s, 3)
        result.publish_rate = round(counts["acked"] / produced_s, 1)
        result.publish_mb_s = round(counts["acked"] * config.message_size / produced_s / 1e6, 2)
        result.end_to_end_rate = round(seen["delivered"] / e2e_s, 1)
        result.calls_per_s = round(counts["calls"] / produced_s, 1)
        result.ack_latency_ms = percentiles(ack_lat)
        if config.broker_pid:
            # from the start of producing until the last delivery: the broker's whole cost of the run
            result.broker_cpu_s = round(cpu_end - cpu_start, 3)
            result.broker_cpu_us_per_msg = round(result.broker_cpu_s * 1e6 / max(1, counts["acked"]), 2)
            result.broker_cpu_us_per_call = round(result.broker_cpu_s * 1e6 / max(1, counts["calls"]), 2)
            result.broker_threads = thread_count(config.broker_pid)
        result.deliver_latency_ms = percentiles(deliver_lat if child else _flatten(deliver_lat))
    finally:
        for p in producers:
            with contextlib.suppress(Exception):
                await p.close()
        for c in consumers:
            with contextlib.suppress(Exception):
                await c.close()
        for c in clients:
            await c.close()
        if child:
            await asyncio.to_thread(child.stop)
    return result


def format_result(result: BenchResult) -> str:
    c = result.config
    lines = [
        (f"topics {c['topic']}-0..{c['topics'] - 1}" if c.get("topics", 1) > 1 else f"topic {c['topic']}")
        + (f" over {c['connections']} connection(s)" if c.get("connections") else "")
        + f"  {c['producers']} producer(s), {c['consumers']} consumer(s) ({c['subscription_type']}), "
        f"{c['message_size']} B messages, batches of {c['batch_size']}, "
        f"{'reliable' if c['reliable'] else 'non-reliable'}"
        + (f", broker sync={c['sync']}" if c["spawn_broker"] else ""),
        f"sent {result.sent:,}  acked {result.acked:,}  delivered {result.delivered:,}  in {result.elapsed_s}s",
        f"publish      {result.publish_rate:>14,.0f} msg/s  ({result.publish_mb_s} MB/s payload)",
        f"end to end   {result.end_to_end_rate:>14,.0f} msg/s",
    ]
    for name, lat in (("publish->ack", result.ack_latency_ms), ("publish->deliver", result.deliver_latency_ms)):
        if lat:
            lines.append(
                f"{name:<17} p50 {lat['p50']} ms  p90 {lat['p90']} ms  p99 {lat['p99']} ms  "
                f"p99.9 {lat['p999']} ms  max {lat['max']} ms"
            )
    lines.append(f"calls        {result.calls_per_s:>14,.0f} send_batch/s ({result.messages_per_call} msg each)")
    if result.broker_cpu_s is not None:
        lines.append(
            f"broker CPU   {result.broker_cpu_s:.2f} s: {result.broker_cpu_us_per_msg} us/msg, "
            f"{result.broker_cpu_us_per_call} us/call, {result.broker_threads} threads"
        )
    if result.machine:
        lines.append(describe_machine(result.machine))
    for error in result.errors[:5]:
        lines.append(f"error: {error}")
    return "\n".join(lines)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure end-to-end throughput and latency",
        description="Run producers and consumers through the batch lane for --duration seconds and report "
        "throughput and latency percentiles (publish->ack, publish->deliver). Targets "
        "--service-url, or starts its own broker with --spawn-broker. Exit 0 when every acked "
        "message was delivered, 1 otherwise.",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--service-url", default=None, help="broker URL (default http://127.0.0.1:6650)")
    target.add_argument(
        "--spawn-broker",
        action="store_true",
        help="start a broker on free loopback ports for the run and stop it afterwards",
    )
    parser.add_argument(
        "--sync",
        choices=["always", "interval", "never"],
        default="interval",
        help="sync policy of the spawned broker (default interval)",
    )
    parser.add_argument("--data-dir", default=None, help="data dir of the spawned broker (default a temp dir)")
    parser.add_argument("--topic", default=None, help="topic (default a fresh /default/bench-<id>)")
    parser.add_argument("--producers", type=positive_int, default=1, help="producers (default 1)")
    parser.add_argument("--consumers", type=positive_int, default=1, help="consumers (default 1)")
    parser.add_argument("--message-size", type=positive_int, default=100, help="payload bytes (default 100)")
    parser.add_argument(
        "--batch-size", type=positive_int, default=1000, help="messages per send_batch call (default 1000)"
    )
    parser.add_argument(
        "--rate",
        type=non_negative_float,
        default=0.0,
        help="total messages per second, 0 = as fast as possible (default 0)",
    )
    parser.add_argument("--duration", type=non_negative_float, default=10.0, help="seconds to produce (default 10)")
    parser.add_argument(
        "--subscription-type",
        choices=SUBSCRIPTION_TYPES,
        default=None,
        help="default exclusive with one consumer, shared with more",
    )
    reliability = parser.add_mutually_exclusive_group()
    reliability.add_argument(
        "--reliable", dest="reliable", action="store_true", default=True, help="WAL-backed topic (default)"
    )
    reliability.add_argument("--non-reliable", dest="reliable", action="store_false", help="in-memory topic")
    parser.add_argument(
        "--topics",
        type=positive_int,
        default=1,
        help="spread producers and consumers round-robin over N topics <topic>-0..N-1; "
        "each gets at least one producer and one consumer (default 1)",
    )
    parser.add_argument(
        "--connections",
        type=positive_int,
        default=None,
        help="client connections, split between producers and consumers in proportion and "
        "shared round-robin, at most one per producer/consumer (default: one each side)",
    )
    parser.add_argument(
        "--max-in-flight", type=positive_int, default=8, help="unacked batches per producer (default 8)"
    )
    parser.add_argument("--linger-ms", type=non_negative_float, default=1.0, help="producer linger (default 1 ms)")
    parser.add_argument(
        "--pace-ms",
        type=non_negative_float,
        default=2.0,
        help="with --rate: one send_batch call per interval, carrying that interval's messages, "
        "at most --batch-size (default 2 ms)",
    )
    parser.add_argument(
        "--in-process-consumers",
        action="store_true",
        help="run the consumers in the bench's event loop instead of a child process",
    )
    parser.add_argument(
        "--broker-pid",
        type=positive_int,
        default=None,
        help="PID of the broker under test (on this machine): report its CPU per message and per "
        "call from /proc (automatic with --spawn-broker)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def _config_from_args(args) -> BenchConfig:
    return BenchConfig(
        service_url=args.service_url or "http://127.0.0.1:6650",
        spawn_broker=args.spawn_broker,
        sync=args.sync,
        data_dir=args.data_dir,
        topic=args.topic,
        producers=args.producers,
        consumers=args.consumers,
        message_size=args.message_size,
        batch_size=args.batch_size,
        rate=args.rate,
        duration=args.duration,
        reliable=args.reliable,
        subscription_type=args.subscription_type,
        max_in_flight=args.max_in_flight,
        linger_ms=args.linger_ms,
        pace_ms=args.pace_ms,
        consumer_process=not args.in_process_consumers,
        progress=not args.no_progress and sys.stderr.isatty() or False,
        topics=args.topics,
        connections=args.connections or 0,
        broker_pid=args.broker_pid,
    )


def run(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    if args.no_progress:
        config.progress = False
    elif not args.json:
        config.progress = True

    def report(result: BenchResult) -> int:
        if args.json:
            print(json.dumps(asdict(result), indent=2))
        else:
            print(format_result(result))
        return EXIT_OK if not result.errors and result.delivered >= result.acked > 0 else EXIT_FAILED

    if config.spawn_broker:
        try:
            with spawned_broker(config.sync, config.data_dir) as broker:
                config.service_url = broker.service_url
                config.broker_pid = broker.proc.pid
                return run_async(lambda: _run_and_report(config, report))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    return run_async(lambda: _run_and_report(config, report))


async def _run_and_report(config: BenchConfig, report) -> int:
    return report(await run_bench(config))
