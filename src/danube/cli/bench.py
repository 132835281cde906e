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

This module runs the producers and reports; the settings and the result are in ``bench_config.py``,
the consumer process in ``bench_consumers.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from dataclasses import asdict

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
from danube.cli.bench_config import (
    STAMP,
    BenchConfig,
    BenchResult,
    bench_clients,
    bench_topics,
    connection_shares,
    percentiles,
)
from danube.cli.bench_consumers import ConsumerProcess, build_consumers, consume, flatten, quiet_gc, stamp_reader
from danube.processes import cpu_seconds, thread_count

__all__ = ["BenchConfig", "BenchResult", "bench_topics", "format_result", "percentiles", "register", "run", "run_bench"]


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
    producer_share = connection_shares(config)[0]
    clients = bench_clients(config, config.producers, producer_share if config.consumer_process else 1.0)
    ack_lat: list[float] = []
    deliver_lat: list[float] = []
    counts = {"sent": 0, "acked": 0, "calls": 0}
    seen = {"delivered": 0, "last": 0.0}
    producing_done = asyncio.Event()
    perf = time.perf_counter
    pad = b"\x00" * max(0, config.message_size - STAMP.size)

    child = ConsumerProcess(config, topic, sub_type) if config.consumer_process else None
    consumers = [] if child else build_consumers(clients, config, topic, sub_type)
    read_stamps = None if child else stamp_reader(config.message_size)
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
            if config.message_size >= STAMP.size:
                payload = STAMP.pack(t0) + pad
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
        with quiet_gc(), observe_machine() as result.machine:
            consumer_tasks = [
                asyncio.ensure_future(consume(c, seen, deliver_lat, config, in_process_finished, read_stamps))
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
        result.deliver_latency_ms = percentiles(deliver_lat if child else flatten(deliver_lat))
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
