"""Scalable topics on 3 brokers (real etcd, loopback): publish latency across a split, and the
throughput of one topic at 1 segment and after splitting it to 4 (docs/scalable-topics.md).

Two figures, one run, one cluster:

- ``latency``: one ScalableProducer publishing keyed 100 B messages at ``--rate`` msg/s; each
  message's latency is send() to durable ack.  p50/p99/max of the messages sent in the steady
  window before the split, and of those sent from the split request until 1 s after it returned.
  Target: no publish waits longer than 1 s.
- ``throughput``: ``--producers`` processes, each a ScalableProducer publishing keyed 100 B
  messages as fast as it can for ``--seconds``, against the topic with 1 segment, then again
  after splitting it to 4 segments (0 → 1, 2; then 1 → 3, 4 and 2 → 5, 6).  Target: ≥ 2.5×.

Each throughput figure is measured twice: every process publishing keys spread over the whole
range (with 4 segments each process splits its batches four ways), and each process publishing
its own quarter of the key range (with 4 segments, one segment per process).

Usage: python bench/scalable_bench.py [--rate 2000] [--producers 4] [--seconds 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import tempfile
import time

from danube.cli.cluster import LocalCluster
from danube.client import DanubeClient
from danube.client.scalable import ScalableProducer
from danube.proto.danube_scalable import scalable_pb2 as pb
from danube.proto.danube_scalable import scalable_pb2_grpc as pb_grpc

PAYLOAD = b"x" * 100


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency_phase(url: str, admin, topic: str, rate: int, steady_s: float) -> dict:
    client = DanubeClient.builder().service_url(url).build()
    producer = await ScalableProducer(client, topic, "latency", linger_ms=1).create()
    samples: list[tuple[float, float]] = []  # (sent at, latency)
    stop = asyncio.Event()

    async def publish():
        interval = 1.0 / rate
        next_at = time.perf_counter()
        i = 0
        while not stop.is_set():
            sent = time.perf_counter()
            fut = await producer.send(PAYLOAD, key=f"k{i % 1000}")
            fut.add_done_callback(lambda f, s=sent: samples.append((s, time.perf_counter() - s)))
            i += 1
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)

    task = asyncio.create_task(publish())
    await asyncio.sleep(1.0)  # warm-up
    steady_from = time.perf_counter()
    await asyncio.sleep(steady_s)
    split_from = time.perf_counter()
    await admin.SplitSegment(pb.SplitSegmentRequest(topic=topic, segment_id=0), timeout=60)
    split_took = time.perf_counter() - split_from
    await asyncio.sleep(1.0)
    split_to = time.perf_counter()
    stop.set()
    await task
    await producer.flush()
    await producer.close()
    await client.close()
    steady = [lat for s, lat in samples if steady_from <= s < split_from]
    during = [lat for s, lat in samples if split_from <= s < split_to]

    def summary(values):
        return {
            "messages": len(values),
            "p50_ms": round(percentile(values, 0.5) * 1000, 2),
            "p99_ms": round(percentile(values, 0.99) * 1000, 2),
            "max_ms": round(max(values) * 1000, 2) if values else None,
        }

    return {
        "rate": rate,
        "split_request_s": round(split_took, 3),
        "steady": summary(steady),
        "during_split": summary(during),
        "rerouted": producer.reroutes,
    }


def _keys_of(index: int, producers: int, affinity: bool) -> list[str]:
    """Keys for worker ``index``: any key, or (affinity) keys hashing into its 1/producers of the range."""
    from danube.model.segment_layout import HASH_SPACE, key_hash

    if not affinity:
        return [f"k{i}" for i in range(10_000)]
    lo, hi = index * HASH_SPACE // producers, (index + 1) * HASH_SPACE // producers
    out: list[str] = []
    i = 0
    while len(out) < 2_000:
        key = f"k{index}-{i}"
        if lo <= key_hash(key) < hi:
            out.append(key)
        i += 1
    return out


def _throughput_worker(
    url: str, topic: str, index: int, start_at: float, seconds: float, out, producers: int = 1, affinity: bool = False
) -> None:
    async def run() -> int:
        client = DanubeClient.builder().service_url(url).build()
        producer = await ScalableProducer(client, topic, f"tput-{index}", linger_ms=5, max_in_flight=8).create()
        rng = random.Random(index)
        keys = _keys_of(index, producers, affinity)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        end = time.time() + seconds
        acked = 0

        def done(f):
            nonlocal acked
            if not f.cancelled() and f.exception() is None:
                acked += 1

        while time.time() < end:
            for _ in range(100):
                fut = await producer.send(PAYLOAD, key=rng.choice(keys))
                fut.add_done_callback(done)
            await asyncio.sleep(0)  # send() does not yield while there is window: let the acks in
        counted = acked  # acked within the window
        await producer.close()
        await client.close()
        return counted

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        out.put(runner.run(run()))


def throughput(urls: list[str], topic: str, producers: int, seconds: float, affinity: bool = False) -> float:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    procs = [
        ctx.Process(
            target=_throughput_worker, args=(urls[i % len(urls)], topic, i, start_at, seconds, out, producers, affinity)
        )
        for i in range(producers)
    ]
    for p in procs:
        p.start()
    counts = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    print(f"  per producer process: {counts}", file=sys.stderr)
    return sum(counts) / seconds


async def admin_call(url: str, method: str, request):
    import grpc

    async with grpc.aio.insecure_channel(url.split("://", 1)[-1]) as channel:
        return await getattr(pb_grpc.ScalableTopicsStub(channel), method)(request, timeout=60)


async def latency_run(url: str, rate: int, steady_s: float) -> dict:
    import grpc

    topic = "/default/bench-latency"
    async with grpc.aio.insecure_channel(url.split("://", 1)[-1]) as channel:
        admin = pb_grpc.ScalableTopicsStub(channel)
        await admin.CreateScalableTopic(pb.CreateScalableTopicRequest(topic=topic, num_segments=1), timeout=60)
        return await latency_phase(url, admin, topic, rate, steady_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--steady", type=float, default=4.0)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cluster = LocalCluster(brokers=3, base_dir=tempfile.mkdtemp(prefix="danube-scalable-bench-"), lease_ttl=5)
    cluster.start(timeout=90)
    try:
        urls = [p.url for p in cluster.procs]
        result: dict = {"brokers": 3, "latency": asyncio.run(latency_run(urls[0], args.rate, args.steady))}
        topic = "/default/bench-throughput"
        asyncio.run(
            admin_call(urls[0], "CreateScalableTopic", pb.CreateScalableTopicRequest(topic=topic, num_segments=1))
        )
        one = throughput(urls, topic, args.producers, args.seconds)
        one_aff = throughput(urls, topic, args.producers, args.seconds, affinity=True)
        for sid in (0, 1, 2):
            asyncio.run(admin_call(urls[1], "SplitSegment", pb.SplitSegmentRequest(topic=topic, segment_id=sid)))
        four = throughput(urls, topic, args.producers, args.seconds)
        four_aff = throughput(urls, topic, args.producers, args.seconds, affinity=True)
        result["throughput"] = {
            "producers": args.producers,
            "seconds": args.seconds,
            "one_segment_msgs_per_s": round(one),
            "four_segments_msgs_per_s": round(four),
            "ratio": round(four / one, 2) if one else None,
            "key_affinity": {
                "one_segment_msgs_per_s": round(one_aff),
                "four_segments_msgs_per_s": round(four_aff),
                "ratio": round(four_aff / one_aff, 2) if one_aff else None,
            },
        }
    finally:
        cluster.stop()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lat = result["latency"]
        print(
            f"publish latency at {lat['rate']} msg/s: steady p50 {lat['steady']['p50_ms']} ms, "
            f"p99 {lat['steady']['p99_ms']} ms, max {lat['steady']['max_ms']} ms; during the split "
            f"p50 {lat['during_split']['p50_ms']} ms, p99 {lat['during_split']['p99_ms']} ms, "
            f"max {lat['during_split']['max_ms']} ms (split request {lat['split_request_s']} s, "
            f"{lat['rerouted']} messages re-routed)"
        )
        tp = result["throughput"]
        ka = tp["key_affinity"]
        print(
            f"throughput, {tp['producers']} producer processes, keys spread: 1 segment "
            f"{tp['one_segment_msgs_per_s']} msg/s, 4 segments {tp['four_segments_msgs_per_s']} msg/s, "
            f"ratio {tp['ratio']}; each process its own quarter of the keys: 1 segment "
            f"{ka['one_segment_msgs_per_s']} msg/s, 4 segments {ka['four_segments_msgs_per_s']} msg/s, "
            f"ratio {ka['ratio']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
