"""`danube bench`: one producer process's share of a run, and the merge of every share into one result.

A share (``run_part``) sets up its producers, its consumers (in a consumer process of its own, or in
its loop), waits at its gate until every share is ready, produces until the common deadline, waits for
its deliveries and returns raw counts, latency samples and CPU figures.  ``merge`` adds counts, takes
percentiles over every sample of every share, and spans the window from the first start to the last
delivery (``perf_counter`` is CLOCK_MONOTONIC: one clock for every process on the machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from dataclasses import dataclass, field
from typing import Protocol

from danube.cli import bench_cpu
from danube.cli.bench_config import (
    BenchConfig,
    BenchResult,
    bench_clients,
    bench_topics,
    connection_shares,
    percentiles,
)
from danube.cli.bench_consumers import ConsumerProcess, build_consumers, consume, flatten, quiet_gc, stamp_reader
from danube.cli.bench_produce import Pacer


class Gate(Protocol):
    async def ready(self) -> float:
        """Called once set up; returns the moment (perf_counter) to start producing."""

    def sent(self) -> None:
        """Called when the calls stop (the deadline), before waiting for their acks."""

    def drained(self) -> None:
        """Called when the measured window ends (every delivery in), before the clients close."""


@dataclass
class PartResult:
    offered: int = 0  # messages the schedule placed before the deadline (paced runs; 0 as fast as possible)
    sent: int = 0
    acked: int = 0
    calls: int = 0
    delivered: int = 0
    start: float = 0.0  # perf_counter when producing started
    sent_end: float = 0.0  # ... when the last call was made
    produced_end: float = 0.0  # ... when every call was answered
    last: float = 0.0  # ... of the last delivery
    ack_latencies: array = field(default_factory=lambda: array("d"))  # seconds, one per call
    deliver_latencies: array = field(default_factory=lambda: array("d"))  # seconds, one per message
    errors: list = field(default_factory=list)
    producer_cpu_s: float = 0.0  # this process, producing until the last delivery
    consumer_cpu_s: float = 0.0  # its consumer process, same window
    # while making calls (until the deadline; the wait for the last acks is not counted):
    producer_core: float = 0.0  # this process, in cores
    sending_cpu_s: float = 0.0  # this process and its consumer process
    consumer_core: float = 0.0  # its consumer process, in cores
    machine_busy_pct: float | None = None  # the machine's CPUs
    pacer_lag_s: float = 0.0  # the most a call came after its scheduled time


def messages_per_call(config: BenchConfig) -> int:
    """--batch-size as fast as possible; with --rate, one --pace-ms interval's worth (at most --batch-size)."""
    if config.rate <= 0:
        return config.batch_size
    per_producer = config.rate / config.producers
    return max(1, min(config.batch_size, round(per_producer * max(config.pace_ms, 0.1) / 1000)))


async def run_part(config: BenchConfig, topic: str, sub_type: str, gate: Gate, progress=None) -> PartResult:
    """This process's producers and consumers (``config`` is its share); ``progress(acked, delivered,
    done)`` runs beside the producing when given."""
    part = PartResult()
    topics = bench_topics(config, topic)
    per_call = messages_per_call(config)
    clients = bench_clients(config, config.producers, connection_shares(config)[0] if config.consumer_process else 1.0)
    child = ConsumerProcess(config, topic, sub_type) if config.consumer_process else None
    consumers = [] if child else build_consumers(clients, config, topic, sub_type)
    read_stamps = None if child else stamp_reader(config.message_size)
    # Paced calls are smaller: more of them in flight, so the messages in flight stay as many as at full size.
    in_flight = config.max_in_flight * -(-config.batch_size // per_call)
    producers = [
        clients[i % len(clients)]
        .new_producer()
        .with_topic(topics[i % len(topics)])
        .with_name(f"bench-p{i}")
        .with_reliable(config.reliable)
        .with_linger_ms(config.linger_ms)
        .with_max_batch_bytes(config.max_batch_bytes)
        .with_max_in_flight(in_flight)
        .build()
        for i in range(config.producers)
    ]
    rate = config.rate / config.producers if config.rate > 0 else 0.0
    pacer = Pacer(producers, per_call, config.message_size, in_flight * 2, rate)
    seen: dict = {"delivered": 0, "last": 0.0}
    deliver_lat: list = []
    producing_done = asyncio.Event()

    def in_process_finished() -> bool:
        return producing_done.is_set() and seen["delivered"] >= pacer.acked

    def delivered() -> int:
        return child.delivered.value if child else int(seen["delivered"])

    consumer_tasks: list = []
    progress_task = None
    perf = time.perf_counter
    try:
        if child:
            await child.ready(config.consumers)
        else:
            await asyncio.gather(*(c.subscribe() for c in consumers))
        await asyncio.gather(*(p.create() for p in producers))
        start = await gate.ready()
        await asyncio.sleep(max(0.0, start - perf()))
        with quiet_gc():
            consumer_tasks = [
                asyncio.ensure_future(consume(c, seen, deliver_lat, config, in_process_finished, read_stamps))
                for c in consumers
            ]
            mark0 = bench_cpu.mark(config.broker_pid)
            start = perf()
            if progress is not None:
                progress_task = asyncio.ensure_future(progress(lambda: pacer.acked, delivered, producing_done))
            await pacer.produce(start, start + config.duration)
            part.sent_end = perf()
            mark1 = bench_cpu.mark(config.broker_pid)
            gate.sent()
            await pacer.settle()
            producing_done.set()
            part.produced_end = perf()
            if child:
                answer = await child.finish(pacer.acked, config.drain_timeout)
                if "error" in answer:
                    part.errors.append(answer["error"])
                seen["delivered"], seen["last"] = answer.get("delivered", 0), answer.get("last", 0.0)
                part.deliver_latencies = array("d", answer.get("latencies", []))
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.gather(*consumer_tasks), config.drain_timeout)
                part.deliver_latencies = array("d", flatten(deliver_lat))
            mark2 = bench_cpu.mark(config.broker_pid)
            gate.drained()
            for task in consumer_tasks:
                task.cancel()
            await asyncio.gather(*consumer_tasks, *([progress_task] if progress_task else []), return_exceptions=True)
        producing = bench_cpu.span(mark0, mark1, part.sent_end - start)
        whole = bench_cpu.span(mark0, mark2, perf() - start)
        part.start, part.last = start, float(seen["last"])
        part.sent, part.acked, part.calls, part.delivered = pacer.sent, pacer.acked, pacer.calls, int(seen["delivered"])
        part.offered, part.pacer_lag_s = pacer.offered, pacer.lag_max
        part.ack_latencies = pacer.ack_latencies
        part.errors.extend(pacer.errors)
        part.producer_cpu_s, part.consumer_cpu_s = whole.own_s, whole.children_s
        part.producer_core, part.consumer_core = producing.own_core, producing.children_core_max
        part.sending_cpu_s = producing.own_s + producing.children_s
        part.machine_busy_pct = bench_cpu.machine_busy_pct(mark0, mark1)
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
    return part


def merge(parts: list[PartResult], config: BenchConfig, result: BenchResult, coordinator_cpu_s: float = 0.0) -> None:
    """Fills ``result`` from every share: counts added, percentiles over all samples, one window from the
    first start to the last answer and delivery."""
    sent, acked = sum(p.sent for p in parts), sum(p.acked for p in parts)
    calls, delivered = sum(p.calls for p in parts), sum(p.delivered for p in parts)
    start = min(p.start for p in parts)
    produced_s = max(max(p.produced_end for p in parts) - start, 1e-9)
    sending_s = max(max(p.sent_end for p in parts) - start, 1e-9)
    e2e_s = max(max(p.last for p in parts) - start, 1e-9)
    for p in parts:
        result.errors.extend(p.errors)
    if delivered < acked:
        result.errors.append(
            f"only {delivered} of {acked} acked messages were delivered within {config.drain_timeout}s"
        )
    result.sent, result.acked, result.delivered = sent, acked, delivered
    # Counted, not a rate: every message made is either delivered (within the drain timeout after the
    # last call) or missing.  A rate over a window that ends with the last delivery is below the offered
    # rate by the tail latency even when nothing is lost.
    result.offered = sum(p.offered for p in parts)
    result.missing = max(0, sent - delivered)
    result.delivered_of_sent = round(delivered / sent, 5) if sent else None
    result.pacer_lag_ms = round(max(p.pacer_lag_s for p in parts) * 1000, 1)
    result.elapsed_s = round(produced_s, 3)
    result.publish_rate = round(acked / produced_s, 1)
    result.sent_rate = round(sent / sending_s, 1)
    result.publish_mb_s = round(acked * config.message_size / produced_s / 1e6, 2)
    result.end_to_end_rate = round(delivered / e2e_s, 1)
    result.calls, result.calls_per_s = calls, round(calls / produced_s, 1)
    result.ack_latency_ms = percentiles(_joined(p.ack_latencies for p in parts))
    result.deliver_latency_ms = percentiles(_joined(p.deliver_latencies for p in parts))
    result.client_processes = len(parts)
    result.producer_cpu_s = round(sum(p.producer_cpu_s for p in parts), 3)
    result.consumer_cpu_s = round(sum(p.consumer_cpu_s for p in parts), 3)
    client = sum(p.producer_cpu_s + p.consumer_cpu_s for p in parts) + coordinator_cpu_s
    # never below its printed parts: rounded apart, their sum can exceed the rounded whole by 0.001
    # when the coordinator's own share is near zero
    result.client_cpu_s = max(round(client, 3), result.producer_cpu_s + result.consumer_cpu_s)
    result.client_cpu_us_per_msg = round(client * 1e6 / max(1, acked), 2)
    result.client_cpu_us_per_call = round(client * 1e6 / max(1, calls), 2)
    result.producer_core_max = round(max(p.producer_core for p in parts), 3)
    result.consumer_core_max = round(max(p.consumer_core for p in parts), 3)
    result.client_cores = round(sum(p.sending_cpu_s for p in parts) / sending_s, 3)
    busy = [p.machine_busy_pct for p in parts if p.machine_busy_pct is not None]
    result.machine_busy_pct = max(busy) if busy else None


def _joined(samples) -> list[float]:
    out = array("d")
    for part in samples:
        out.extend(part)
    return out.tolist()
