"""Topics placed per second by the cluster leader (3 brokers, real etcd, loopback).

Two figures:

- ``markers``: N unassigned markers are written to etcd in bulk (transactions of 100), and
  the clock runs until every one of the N topics has an assignment: the leader's load
  manager alone (ranking, round robin, batched transactions);
- ``lookups``: N TopicLookup calls for new topics, spread over the 3 brokers with
  ``--concurrency`` in flight: what clients see (marker transaction on the broker asked,
  placement by the leader, the answer once the assignment reaches that broker's view).

Usage: python bench/cluster_assign.py [--topics 1000] [--concurrency 64] [--json]
Target: >= 1,000 topics/s with 3 brokers.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time

from danube.cli.cluster import LocalCluster
from danube.metadata import keys
from danube.metadata.etcd import EtcdMetadataStore
from danube.metadata.store import Op


async def count_assigned(store: EtcdMetadataStore, prefix_topic: str) -> int:
    kvs = await store.get_prefix("/cluster/brokers/")
    return sum(1 for kv in kvs if f"/{prefix_topic}/" in kv.key)


async def bench_markers(cluster: LocalCluster, n: int) -> dict:
    store = EtcdMetadataStore(cluster.etcd.url)
    ns = "bench-markers"
    try:
        topics = [f"/{ns}/t{i}" for i in range(n)]
        started = time.perf_counter()
        for i in range(0, n, 100):
            await store.txn([], [Op.put(keys.unassigned(t), b"null") for t in topics[i : i + 100]])
        written = time.perf_counter()
        while await count_assigned(store, ns) < n:
            await asyncio.sleep(0.01)
        done = time.perf_counter()
        kvs = await store.get_prefix("/cluster/brokers/")
        per_broker = collections.Counter(kv.key.split("/")[3] for kv in kvs if f"/{ns}/" in kv.key)
    finally:
        await store.close()
    return {
        "topics": n,
        "seconds": round(done - started, 3),
        "write_markers_s": round(written - started, 3),
        "topics_per_s": round(n / (done - started)),
        "per_broker": dict(per_broker),
    }


async def bench_lookups(cluster: LocalCluster, n: int, concurrency: int) -> dict:
    import grpc

    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    channels = [grpc.aio.insecure_channel(p.url.split("//")[1]) for p in cluster.procs]
    stubs = [pb_grpc.DiscoveryStub(c) for c in channels]
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    owners: collections.Counter = collections.Counter()
    failed = 0

    async def worker():
        nonlocal failed
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            reply = await stubs[i % len(stubs)].TopicLookup(
                pb.TopicLookupRequest(request_id=i, topic=f"/bench-lookups/t{i}"), timeout=60
            )
            if reply.response_type == pb.TopicLookupResponse.Failed:
                failed += 1
            else:
                owners[reply.broker_url] += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        for c in channels:
            await c.close()
    return {
        "topics": n,
        "concurrency": concurrency,
        "seconds": round(elapsed, 3),
        "topics_per_s": round(n / elapsed),
        "failed": failed,
        "per_broker": dict(owners),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="danube-bench-cluster-") as base:
        cluster = LocalCluster(brokers=args.brokers, base_dir=base, log_level="WARNING", load_report_interval=5)
        cluster.start()
        try:
            markers = asyncio.run(bench_markers(cluster, args.topics))
            lookups = asyncio.run(bench_lookups(cluster, args.topics, args.concurrency))
        finally:
            cluster.stop()
    result = {"brokers": args.brokers, "markers": markers, "lookups": lookups}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.brokers} brokers, {args.topics} topics")
        print(
            f"  leader placement (markers written in bulk): {markers['topics_per_s']:>6} topics/s "
            f"({markers['seconds']} s; per broker {markers['per_broker']})"
        )
        print(
            f"  client lookups of new topics ({args.concurrency} in flight): {lookups['topics_per_s']:>6} topics/s "
            f"({lookups['seconds']} s; failed {lookups['failed']}; per broker {lookups['per_broker']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
