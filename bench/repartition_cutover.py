"""Publish throughput and latency during live repartition cutovers against steady state, in one run.

A standalone broker subprocess (loopback, free ports, stopped by PID) or, with ``--brokers N``, a
real etcd and N `danube broker --etcd` subprocesses (tests/support/cluster.py, what the cluster
tests start), one danube.client producer publishing keyed 100 B messages at a paced rate, one
consumer draining, and `RepartitionTopic` (admin gRPC) growing the topic 2 -> 4 and then shrinking
it 4 -> 2.  A message's latency is send() call -> its future resolved (it includes any wait at the
producer's cutover barrier and the re-routing of refused batches).  Reported per phase:
messages/s and p50/p99/max.

    python bench/repartition_cutover.py [--brokers 3] [--seconds-per-phase 4] [--rate 20000] [--json]

Target (docs/repartition.md): throughput in the second after each cutover >= 80% of steady state, and no
publish waits longer than 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from typing import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import grpc  # noqa: E402

from danube.client import DanubeClient, SubType  # noqa: E402
from danube.proto.danube_admin import admin_pb2 as admin_pb  # noqa: E402
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc  # noqa: E402
from tests.support.broker import running_broker  # noqa: E402
from tests.support.cluster import local_cluster  # noqa: E402

T = "/default/cutover-bench"
KEYS = [f"customer-{i}" for i in range(1000)]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@contextlib.contextmanager
def service(brokers: int) -> Iterator[tuple[str, str]]:
    """(service URL for the client, host:port of an admin endpoint)."""
    if brokers == 1:
        with running_broker("--sync", "interval") as broker:
            yield broker.url, f"127.0.0.1:{broker.admin_port}"
        return
    with (
        tempfile.TemporaryDirectory(prefix="danube-cutover-bench-") as base,
        local_cluster(base, brokers=brokers, extra_args=("--sync", "interval")) as cluster,
    ):
        # the client bootstraps on one broker, the repartition is asked of another (any broker answers)
        yield cluster.procs[0].url, cluster.procs[-1].admin_url.split("://", 1)[-1]


def run(seconds: float, rate: int, brokers: int = 1) -> dict:
    # a local cluster is started outside the event loop (it waits on etcd with its own asyncio.run)
    with service(brokers) as (url, admin_addr):
        return asyncio.run(measure(url, admin_addr, seconds, rate, brokers))


async def measure(url: str, admin_addr: str, seconds: float, rate: int, brokers: int) -> dict:
    client = DanubeClient.builder().service_url(url).build()
    producer = client.new_producer().with_topic(T).with_name("bench").with_partitions(2).with_max_in_flight(8).build()
    await producer.create()
    for k in KEYS[:64]:
        await producer.send(b"x", key=k)
    await producer.flush()
    consumer = (
        client.new_consumer()
        .with_topic(T)
        .with_consumer_name("c")
        .with_subscription("s")
        .with_subscription_type(SubType.Exclusive)
        .with_reliable(True)
        .build()
    )
    await consumer.subscribe()
    samples: list[tuple[float, float]] = []  # (sent at, latency) per message
    stop = asyncio.Event()
    payload = b"p" * 100

    async def publish():
        # paced: `rate` messages/s in 10 ms ticks, so latency is the service's, not a queue's
        loop = asyncio.get_running_loop()
        i = 0
        per_tick = max(1, rate // 100)
        next_tick = loop.time()
        while not stop.is_set():
            for _ in range(per_tick):
                t0 = loop.time()
                fut = await producer.send(payload, key=KEYS[i % len(KEYS)])
                fut.add_done_callback(lambda f, t0=t0: samples.append((t0, loop.time() - t0)))
                i += 1
            next_tick += 0.01
            delay = next_tick - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    async def consume():
        async for m in consumer:
            await consumer.ack(m)

    async def repartition(n: int) -> float:
        async with grpc.aio.insecure_channel(admin_addr) as ch:
            t0 = asyncio.get_running_loop().time()
            await admin_grpc.TopicAdminStub(ch).RepartitionTopic(
                admin_pb.RepartitionRequest(name=T, partitions=n), timeout=30
            )
            return t0

    async def finalized(timeout: float = 60.0) -> float:
        """Seconds until the transition in progress finalized (one repartition at a time)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with grpc.aio.insecure_channel(admin_addr) as ch:
            while True:
                info = await admin_grpc.TopicAdminStub(ch).DescribePartitioning(
                    admin_pb.TopicRequest(name=T), timeout=10
                )
                if not info.marker_json:
                    return loop.time() - t0
                if loop.time() - t0 > timeout:
                    raise TimeoutError(f"{T}: not finalized after {timeout} s: {info.marker_json}")
                await asyncio.sleep(0.1)

    tasks = [asyncio.ensure_future(publish()), asyncio.ensure_future(consume())]
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.sleep(seconds)
    grow_at = await repartition(4)
    await asyncio.sleep(seconds)
    grow_finalized_s = await finalized() + seconds
    shrink_at = await repartition(2)
    await asyncio.sleep(seconds)
    shrink_finalized_s = await finalized() + seconds
    stop.set()
    await asyncio.wait_for(tasks[0], 30)
    await producer.flush()
    end = loop.time()
    tasks[1].cancel()
    await asyncio.gather(tasks[1], return_exceptions=True)
    cutovers = producer.cutovers
    await producer.close()
    await consumer.close()
    await client.close()

    def phase(lo: float, hi: float) -> dict:
        lat = [latency for t, latency in samples if lo <= t < hi]  # sent in the window
        acked = sum(1 for t, latency in samples if lo <= t + latency < hi)  # acked in the window
        return {
            "seconds": round(hi - lo, 2),
            "messages": len(lat),
            "msgs_per_s": round(acked / (hi - lo)),
            "p50_ms": round(pct(lat, 0.5) * 1000, 2),
            "p99_ms": round(pct(lat, 0.99) * 1000, 2),
            "max_ms": round(max(lat) * 1000, 2) if lat else None,
        }

    steady = phase(start + 1.0, grow_at)
    grow = phase(grow_at, grow_at + 1.0)
    shrink = phase(shrink_at, shrink_at + 1.0)
    whole = phase(start, end)
    return {
        "steady": steady,
        "grow_cutover_1s": grow,
        "shrink_cutover_1s": shrink,
        "whole_run": whole,
        "grow_vs_steady": round(grow["msgs_per_s"] / steady["msgs_per_s"], 3),
        "shrink_vs_steady": round(shrink["msgs_per_s"] / steady["msgs_per_s"], 3),
        "max_publish_wait_ms": whole["max_ms"],
        "producer_cutovers": cutovers,
        # where the longest waits were sent, in seconds from the start (the grow/shrink calls at)
        "longest_waits_sent_at_s": sorted(
            {round(t - start, 1) for t, latency in sorted(samples, key=lambda x: -x[1])[:50]}
        ),
        "grow_at_s": round(grow_at - start, 1),
        "shrink_at_s": round(shrink_at - start, 1),
        # upper bounds: checked only after a phase's seconds elapsed
        "grow_finalized_within_s": round(grow_finalized_s, 1),
        "shrink_finalized_within_s": round(shrink_finalized_s, 1),
        "offered_msgs_per_s": rate,
        "brokers": brokers,
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds-per-phase", type=float, default=4.0)
    parser.add_argument("--rate", type=int, default=20_000, help="messages/s offered")
    parser.add_argument("--brokers", type=int, default=1, help="1: a standalone broker; N > 1: etcd + N brokers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.brokers < 1:
        parser.error("--brokers must be at least 1")
    result = run(args.seconds_per_phase, args.rate, args.brokers)
    if args.json:
        print(json.dumps(result))
    else:
        for name in ("steady", "grow_cutover_1s", "shrink_cutover_1s", "whole_run"):
            print(f"{name:18s} {result[name]}")
        print(
            f"throughput in the cutover second / steady: grow {result['grow_vs_steady']:.0%}, "
            f"shrink {result['shrink_vs_steady']:.0%}; longest publish wait {result['max_publish_wait_ms']} ms; "
            f"producer cutovers {result['producer_cutovers']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
