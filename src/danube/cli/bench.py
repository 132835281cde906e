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

The client's own CPU is reported beside the broker's (``bench_cpu.py``): on a small machine the bench's
Python processes compete with the broker for the cores, and a run that did not offer its rate says so.
``--client-processes N`` spreads the producers over N processes (``bench_workers.py``).

This module reports; the settings and the result are in ``bench_config.py``, one process's producing
in ``bench_parts.py`` and ``bench_produce.py``, the consumer process in ``bench_consumers.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from dataclasses import asdict

from danube.cli._client_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    SUBSCRIPTION_TYPES,
    non_negative_float,
    positive_int,
    run_async,
)
from danube.cli._machine import describe as describe_machine
from danube.cli._process import spawned_broker
from danube.cli.bench_config import BenchConfig, BenchResult, bench_topics, percentiles
from danube.cli.bench_cpu import verdict
from danube.cli.bench_parts import merge, messages_per_call, run_part
from danube.cli.bench_workers import Window, run_split
from danube.processes import thread_count

__all__ = [
    "BenchConfig",
    "BenchResult",
    "BenchUsageError",
    "bench_topics",
    "format_result",
    "messages_per_call",
    "percentiles",
    "register",
    "run",
    "run_bench",
]


class BenchUsageError(ValueError):
    """Settings that cannot make a run (the CLI exits 2 with this sentence)."""


class _LocalGate:
    """The one-process run: start at once; the measured window is this process's."""

    def __init__(self, window: Window) -> None:
        self._window = window

    async def ready(self) -> float:
        self._window.open()
        return time.perf_counter()

    def sent(self) -> None:
        self._window.sent()

    def drained(self) -> None:
        self._window.close()


def _progress(config: BenchConfig):
    if not config.progress:
        return None

    async def show(acked, delivered, done: asyncio.Event) -> None:
        from tqdm import tqdm

        perf = time.perf_counter
        start = perf()
        with tqdm(
            total=round(config.duration, 1),
            unit="s",
            desc="bench",
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f}s {postfix}",
        ) as bar:
            last_n, last_t = 0, start
            while not done.is_set():
                await asyncio.sleep(0.5)
                now = perf()
                bar.n = round(min(now - start, config.duration), 1)
                n = delivered()
                rate = (n - last_n) / (now - last_t)
                last_n, last_t = n, now
                bar.set_postfix_str(f"acked {acked():,} delivered {n:,} ({rate:,.0f} msg/s)")

    return show


async def run_bench(config: BenchConfig) -> BenchResult:
    """Runs the workload against ``config.service_url``; returns the measurements."""
    topic = config.topic or f"/default/bench-{uuid.uuid4().hex[:8]}"
    if config.topics > 1:  # every topic gets a producer and a consumer at least
        config.producers = max(config.producers, config.topics)
        config.consumers = max(config.consumers, config.topics)
    check_client_processes(config)
    topics = bench_topics(config, topic)
    sub_type = config.subscription_type or ("shared" if config.consumers > len(topics) else "exclusive")
    result = BenchResult(config={**asdict(config), "topic": topic, "subscription_type": sub_type})
    result.messages_per_call = messages_per_call(config)
    result.offered_rate = config.rate
    window = Window(config.broker_pid)
    began = time.monotonic()
    if config.client_processes > 1:
        await run_split(config, topic, sub_type, result, window)
    else:
        part = await run_part(config, topic, sub_type, _LocalGate(window), _progress(config))
        merge([part], config, result)
    result.machine = window.machine
    result.setup_s = round(window.opened_at - began, 2) if window.opened_at else 0.0
    if window.broker_cpu_s is not None:
        # from the start of producing until the last delivery: the broker's whole cost of the run
        result.broker_cpu_s = round(window.broker_cpu_s, 3)
        result.broker_cpu_us_per_msg = round(window.broker_cpu_s * 1e6 / max(1, result.acked), 2)
        result.broker_cpu_us_per_call = round(window.broker_cpu_s * 1e6 / max(1, result.calls), 2)
        result.broker_threads = thread_count(config.broker_pid)
        if window.broker_sending_cores is not None:
            result.broker_cores = round(window.broker_sending_cores, 3)
    if result.client_cpu_s is not None and result.acked:
        # counted: a rate over a window ending with the last delivery is short by the tail latency
        delivered_rate = config.rate * result.delivered / result.offered if result.offered else result.end_to_end_rate
        result.limited_by, result.limit = verdict(
            offered_rate=config.rate,
            sent_rate=result.sent_rate,
            delivered_rate=delivered_rate,
            producer_core=result.producer_core_max or 0.0,
            consumer_core=result.consumer_core_max or 0.0,
            machine_busy=result.machine_busy_pct,
            client_cores=result.client_cores or 0.0,
            broker_cores=window.broker_sending_cores,
        )
    return result


def check_client_processes(config: BenchConfig) -> None:
    """--client-processes gives each producer process topics of its own: at most one per topic."""
    n = config.client_processes
    if n < 1:
        raise BenchUsageError(f"--client-processes must be at least 1, got {n}")
    if n > 1 and config.topics < n:
        raise BenchUsageError(
            f"--client-processes {n} needs at least {n} topics (each producer process owns its topics), "
            f"got --topics {config.topics}"
        )


def format_result(result: BenchResult) -> str:
    c = result.config
    lines = [
        (f"topics {c['topic']}-0..{c['topics'] - 1}" if c.get("topics", 1) > 1 else f"topic {c['topic']}")
        + (f" over {c['connections']} connection(s)" if c.get("connections") else "")
        + f"  {c['producers']} producer(s), {c['consumers']} consumer(s) ({c['subscription_type']}), "
        f"{c['message_size']} B messages, batches of {c['batch_size']}, "
        f"{'reliable' if c['reliable'] else 'non-reliable'}"
        + (f", broker sync={c['sync']}" if c["spawn_broker"] else ""),
        (f"offered {result.offered:,}  " if result.offered else "")
        + f"sent {result.sent:,}  acked {result.acked:,}  delivered {result.delivered:,}  in {result.elapsed_s}s",
        f"delivered    {result.delivered:,} of {result.sent:,} sent"
        + (f" ({result.delivered_of_sent:.2%})" if result.delivered_of_sent is not None else "")
        + (f", {result.missing:,} missing" if result.missing else ", none missing")
        + (
            f"; the paced calls ran up to {result.pacer_lag_ms:,.0f} ms behind their schedule"
            if result.pacer_lag_ms >= 10
            else ""
        ),
        f"publish      {result.publish_rate:>14,.0f} msg/s  ({result.publish_mb_s} MB/s payload)",
        f"end to end   {result.end_to_end_rate:>14,.0f} msg/s",
    ]
    for name, lat in (("publish->ack", result.ack_latency_ms), ("publish->deliver", result.deliver_latency_ms)):
        if lat:
            lines.append(
                f"{name:<17} p50 {lat['p50']} ms  p90 {lat['p90']} ms  p99 {lat['p99']} ms  "
                f"p99.9 {lat['p999']} ms  max {lat['max']} ms"
            )
    lines.append(
        f"calls        {result.calls_per_s:>14,.0f} send_batch/s ({result.messages_per_call} msg each), "
        f"after {result.setup_s} s of setup"
    )
    if result.broker_cpu_s is not None:
        lines.append(
            f"broker CPU   {result.broker_cpu_s:.2f} s: {result.broker_cpu_us_per_msg} us/msg, "
            f"{result.broker_cpu_us_per_call} us/call, {result.broker_threads} threads"
            + (f"; {result.broker_cores:.2f} cores while calls were made" if result.broker_cores is not None else "")
        )
    if result.client_cpu_s is not None:
        lines.append(
            f"client CPU   {result.client_cpu_s:.2f} s: {result.client_cpu_us_per_msg} us/msg, "
            f"{result.client_cpu_us_per_call} us/call ({result.client_processes} producer process(es) "
            f"{result.producer_cpu_s:.2f} s, consumer process(es) {result.consumer_cpu_s:.2f} s); while making "
            f"calls the client used {result.client_cores:.2f} cores, its busiest producer process "
            f"{result.producer_core_max:.0%} of a core, its busiest consumer process {result.consumer_core_max:.0%}"
            + (f", the machine's CPUs were {result.machine_busy_pct:.0f}% busy" if result.machine_busy_pct else "")
        )
    if result.offered_rate > 0:
        lines.append(
            f"offered      {result.offered_rate:>14,.0f} msg/s, sent {result.sent_rate:,.0f} msg/s "
            f"({result.sent_rate / result.offered_rate:.0%})"
        )
    if result.limit:
        lines.append(f"limit: {result.limit}")
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
        "--service-url, or starts its own broker with --spawn-broker. Reports the CPU of the bench's own "
        "processes per message and per call beside the broker's, and says when the client, not the broker, "
        "was the limit. Exit 0 when every message sent was acked and delivered (counted), 1 otherwise.",
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
    parser.add_argument(
        "--client-processes",
        type=positive_int,
        default=1,
        help="spread the producers, each with its topics, over N producer processes, each with its own "
        "connections and consumer process, so the client is not one Python process's CPU; needs "
        "--topics >= N; no progress bar with N > 1 (default 1)",
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
        client_processes=args.client_processes,
    )


def run(args: argparse.Namespace) -> int:
    config = _config_from_args(args)
    try:
        check_client_processes(config)
    except BenchUsageError as exc:
        print(f"danube bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.no_progress:
        config.progress = False
    elif not args.json:
        config.progress = True

    def report(result: BenchResult) -> int:
        if args.json:
            print(json.dumps(asdict(result), indent=2))
        else:
            print(format_result(result))
        every = result.delivered >= result.sent and result.delivered >= result.acked > 0
        return EXIT_OK if not result.errors and every else EXIT_FAILED

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
