"""Topic moves and failover in cluster mode (3 brokers, real etcd, loopback).

Three figures, taken in one run:

- ``moves``: a topic with ``--history-mb`` MB of history (shared_fs, the WAL on the shared root) is
  moved ``--moves`` times with ``UnloadTopic`` (sent to a broker that does not own it) while a
  danube.client producer publishes sequentially (send, wait for the ack, next); unavailability =
  from the unload call to the first acked publish after that call returned (the old owner sealed:
  that ack came from the new owner).  p50 / p99 / max.  Target p99 <= 500 ms.
- ``failover``: ``kill -9`` of the owner under the same producer; kill -> first acked publish.
  Target <= lease ttl + 2 s.
- ``throughput``: publish throughput of one broker in cluster mode against a standalone broker
  (same storage config, same client, alternated, median of ``--rounds``).  Target >= 90 %.

- ``kill_loss``: with ``local`` and ``object_store`` storage (each broker's WAL on its own disk), the
  acked messages a ``kill -9`` of the owner leaves beyond the durable history in etcd: the unexported
  tail the next owner cannot serve.

Usage: python bench/cluster_moves.py [--history-mb 100] [--moves 20] [--lease-ttl 5] [--loss-seconds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

from danube.cli.cluster import LocalCluster
from danube.client import DanubeClient
from danube.processes import free_ports, stop_process, wait_for_port
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc


def config(base: str) -> str:
    shared = os.path.join(base, "shared")
    os.makedirs(shared, exist_ok=True)
    path = os.path.join(base, "shared.yml")
    with open(path, "w") as f:
        f.write(
            f"storage:\n  mode: shared_fs\n  local_wal_root: {shared}/wal\n  durable:\n    root: {shared}/durable\n"
        )
    return path


async def owner_of(url: str, topic: str) -> str:
    async with grpc.aio.insecure_channel(url.split("//")[1]) as ch:
        r = await pb_grpc.DiscoveryStub(ch).TopicLookup(pb.TopicLookupRequest(request_id=1, topic=topic), timeout=30)
    return url if r.response_type == pb.TopicLookupResponse.Connect else r.broker_url


def client(url: str) -> DanubeClient:
    return (
        DanubeClient.builder()
        .service_url(url)
        .with_retry(initial_backoff_s=0.01, max_backoff_s=0.2, give_up_after_s=60)
        .build()
    )


class Sequential:
    """send, wait for the ack, next: ack times of a producer that always has one message in flight."""

    def __init__(self, producer) -> None:
        self.producer = producer
        self.acks: list[float] = []
        self.running = True
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        i = 0
        while self.running:
            await self.producer.send_and_wait(b"s-%d" % i)
            self.acks.append(time.monotonic())
            i += 1

    def first_after(self, t: float) -> float | None:
        later = [a for a in self.acks if a > t]
        return later[0] if later else None

    async def stop(self) -> None:
        self.running = False
        await asyncio.wait_for(self.task, 60)


async def fill(url: str, topic: str, mb: int) -> float:
    c = client(url)
    p = c.new_producer().with_topic(topic).with_name("fill").build()
    await p.create()
    payload = b"x" * 16384
    started = time.monotonic()
    futures = []
    for _ in range(mb * 1024 * 1024 // len(payload)):
        futures.append(await p.send(payload))
        if len(futures) >= 256:
            await asyncio.gather(*futures)
            futures = []
    await asyncio.gather(*futures)
    await p.close()
    await c.close()
    return time.monotonic() - started


async def moves(cluster: LocalCluster, topic: str, n: int) -> list[float]:
    urls = [p.url for p in cluster.procs]
    c = client(urls[0])
    p = c.new_producer().with_topic(topic).with_name("mover").build()
    await p.create()
    seq = Sequential(p)
    await asyncio.sleep(0.5)
    out = []
    for _ in range(n):
        owner = await owner_of(urls[0], topic)
        admin = next(b.admin_url for b in cluster.procs if b.url != owner)
        t0 = time.monotonic()
        async with grpc.aio.insecure_channel(admin.split("//")[1]) as ch:
            await admin_grpc.TopicAdminStub(ch).UnloadTopic(admin_pb.TopicRequest(name=topic), timeout=60)
        returned = time.monotonic()
        while (first := seq.first_after(returned)) is None:
            await asyncio.sleep(0.005)
        out.append(first - t0)
        await asyncio.sleep(0.5)
    await seq.stop()
    await p.close()
    await c.close()
    return out


async def failover(cluster: LocalCluster, topic: str) -> float:
    urls = [b.url for b in cluster.procs]
    owner = await owner_of(urls[0], topic)
    victim = next(b for b in cluster.procs if b.url == owner)
    entry = next(b for b in cluster.procs if b is not victim)
    c = client(entry.url)
    p = c.new_producer().with_topic(topic).with_name("failover").build()
    await p.create()
    seq = Sequential(p)
    await asyncio.sleep(1.0)
    await asyncio.to_thread(victim.kill)
    killed = time.monotonic()
    while (first := seq.first_after(killed + 0.001)) is None:
        await asyncio.sleep(0.005)
    await seq.stop()
    await p.close()
    await c.close()
    return first - killed


async def throughput(url: str, topic: str, count: int) -> float:
    c = client(url)
    p = c.new_producer().with_topic(topic).with_name("tp").build()
    await p.create()
    payload = b"t" * 1024
    await (await p.send(payload))
    started = time.monotonic()
    futures = []
    for _ in range(count):
        futures.append(await p.send(payload))
        if len(futures) >= 1000:
            await asyncio.gather(*futures)
            futures = []
    await asyncio.gather(*futures)
    elapsed = time.monotonic() - started
    await p.close()
    await c.close()
    return count / elapsed


def standalone(base: str, cfg: str) -> tuple[subprocess.Popen, str]:
    port, admin = free_ports(2)
    data = os.path.join(base, "standalone")
    os.makedirs(data, exist_ok=True)
    with open(cfg) as f:
        text = f.read().replace("/shared", "/standalone-shared")
    path = os.path.join(base, "standalone.yml")
    with open(path, "w") as f:
        f.write(text)
    log = open(os.path.join(data, "broker.log"), "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "broker",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            "--metrics-port",
            "0",
            "--data-dir",
            data,
            "--config",
            path,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    wait_for_port(port, proc, 60)
    return proc, f"http://127.0.0.1:{port}"


async def tail_loss(mode: str, seconds: float, lease_ttl: int) -> dict:
    """``local`` / ``object_store`` (WAL on each broker's disk): publish for ``seconds``, kill -9 the
    owner, and count the acked messages beyond the durable history recorded in etcd (the unexported
    tail: what the next owner cannot serve)."""
    from danube.metadata.etcd import EtcdMetadataStore
    from danube.storage.catalog import SegmentCatalog

    base = tempfile.mkdtemp(prefix=f"danube-loss-{mode}-")
    cluster = LocalCluster(
        brokers=3, base_dir=base, storage=mode, lease_ttl=lease_ttl, load_report_interval=1.0, log_level="WARNING"
    )
    await asyncio.to_thread(cluster.start, 90)
    try:
        topic = "/default/loss"
        urls = [b.url for b in cluster.procs]
        owner = await owner_of(urls[0], topic)
        victim = next(b for b in cluster.procs if b.url == owner)
        entry = next(b for b in cluster.procs if b is not victim)
        c = client(entry.url)
        p = c.new_producer().with_topic(topic).with_name("loss").build()
        await p.create()
        acked: list[int] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            futures = [await p.send(b"l" * 1024) for _ in range(100)]
            acked.extend(await asyncio.gather(*futures))
        await asyncio.to_thread(victim.kill)
        await p.close()
        await c.close()
        store = EtcdMetadataStore(cluster.etcd.url)
        try:
            durable_end = (await SegmentCatalog.load(store, "", topic)).end_offset
        finally:
            await store.close()
        lost = sum(1 for o in acked if o > durable_end)
        return {"acked": len(acked), "durable_end": durable_end, "lost": lost, "seconds": seconds}
    finally:
        await asyncio.to_thread(cluster.stop)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history-mb", type=int, default=100)
    ap.add_argument("--moves", type=int, default=20)
    ap.add_argument("--lease-ttl", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument(
        "--loss-seconds",
        type=float,
        default=5.0,
        help="local/object_store: publish this long, kill -9 the owner, count the unexported tail (0 = skip)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="danube-cluster-moves-")
    cfg = config(base)
    result: dict = {"history_mb": args.history_mb, "lease_ttl_s": args.lease_ttl, "load_avg": os.getloadavg()}
    cluster = LocalCluster(
        brokers=3, base_dir=base, config=cfg, lease_ttl=args.lease_ttl, load_report_interval=1.0, log_level="WARNING"
    )
    cluster.start(timeout=90)
    alone, alone_url = standalone(base, cfg)
    try:
        topic = "/default/history"
        result["fill_s"] = asyncio.run(fill(cluster.procs[0].url, topic, args.history_mb))
        m = asyncio.run(moves(cluster, topic, args.moves))
        result["moves_ms"] = {"p50": pct(m, 0.5) * 1000, "p99": pct(m, 0.99) * 1000, "max": max(m) * 1000, "n": len(m)}
        cl, sa = [], []
        for r in range(args.rounds):
            owner = asyncio.run(owner_of(cluster.procs[0].url, f"/default/tp-{r}"))
            cl.append(asyncio.run(throughput(owner, f"/default/tp-{r}", args.count)))
            sa.append(asyncio.run(throughput(alone_url, f"/default/tp-{r}", args.count)))
        result["throughput_msg_s"] = {
            "cluster": statistics.median(cl),
            "standalone": statistics.median(sa),
            "ratio": statistics.median(cl) / statistics.median(sa),
            "cluster_all": cl,
            "standalone_all": sa,
        }
        result["failover_s"] = asyncio.run(failover(cluster, topic))
        result["failover_target_s"] = args.lease_ttl + 2
    finally:
        stop_process(alone)
        cluster.stop()
    if args.loss_seconds:
        result["kill_loss"] = {
            mode: asyncio.run(tail_loss(mode, args.loss_seconds, args.lease_ttl)) for mode in ("local", "object_store")
        }
    if args.json:
        print(json.dumps(result))
    else:
        mv = result["moves_ms"]
        tp = result["throughput_msg_s"]
        print(
            f"moves ({result['history_mb']} MB history, {mv['n']}): p50 {mv['p50']:.0f} ms, p99 {mv['p99']:.0f} ms, "
            f"max {mv['max']:.0f} ms (target p99 <= 500 ms)"
        )
        print(
            f"failover (kill -9 -> first acked publish): {result['failover_s']:.2f} s "
            f"(lease ttl {args.lease_ttl} s; target <= {result['failover_target_s']} s)"
        )
        print(
            f"throughput, 1 KiB messages: cluster {tp['cluster']:.0f}/s, standalone {tp['standalone']:.0f}/s, "
            f"ratio {tp['ratio']:.2f} (target >= 0.90)"
        )
        for mode, loss in result.get("kill_loss", {}).items():
            print(
                f"kill -9 with {mode} storage after {loss['seconds']:.0f} s of publishing: {loss['lost']} of "
                f"{loss['acked']} acked messages beyond the durable history (durable through {loss['durable_end']})"
            )
        print(f"load average {result['load_avg']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
