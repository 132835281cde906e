"""Broker faults under danube-client 0.5.0 with its default options (3 brokers, real etcd, loopback,
shared_fs with the WAL on the shared root): how long a send waits through each fault, and what is lost.

One official-client application (a Reliable producer sending one message at a time, an Exclusive
consumer acking everything; ``tests/e2e/danube_client_scripts/fault_load.py``) runs against a broker
that stays up while the topic's owner suffers, one kind after another, ``--reps`` times:

- ``unload``: ``danube admin topics unload`` (through a broker that does not own it);
- ``rebalance``: a move as the rebalancer writes it (marker + the owner's assignment deleted);
- ``sigterm``: a graceful stop of the owner (restarted afterwards);
- ``kill9``: ``kill -9`` of the owner (restarted afterwards);
- ``sigstop``: the owner stopped for the lease ttl + 2.5 s, then continued.

Per fault: the longest a single send waited through it (``stall``: from the send's start to its
ack), p50 / p99 / max over the repetitions; ``errors``: exceptions that reached the application;
``lost``: acked messages never delivered to the consumer (must be 0); ``redelivered``, and of those
the copies delivered after a fault although the consumer's ack was answered OK before it (must be 0
for moves and graceful stops).  Targets:
moves and graceful stops p99 <= 500 ms; kill -9 <= lease ttl + 2 s.

``--hop``: the cost of the extra hop, Danube's SendMessage to the owner vs through another broker
(alternated rounds, median; 1 and 32 calls in flight).

Usage: python bench/faults.py [--faults unload,rebalance,sigterm,kill9,sigstop] [--reps 20] [--kill-reps 5]
       [--lease-ttl 3] [--hop] [--trace] [--json]     (run it under flock /tmp/danube-bench.lock)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

# run as `python bench/faults.py`: bench/ is on sys.path
from cluster_moves import config, owner_of  # noqa: E402

from danube.cli.cluster import LocalCluster
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.proto.danube_admin import admin_pb2 as admin_pb
from danube.proto.danube_admin import admin_pb2_grpc as admin_grpc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT_PYTHON = os.path.join(REPO, ".venvs", "danube-client", "bin", "python")
SCRIPT = os.path.join(REPO, "tests", "e2e", "danube_client_scripts", "fault_load.py")
MOVES = ("unload", "rebalance")


async def unload(admin_url: str, topic: str) -> None:
    async with grpc.aio.insecure_channel(admin_url.split("//")[1]) as ch:
        await admin_grpc.TopicAdminStub(ch).UnloadTopic(admin_pb.TopicRequest(name=topic), timeout=60)


async def rebalance(etcd_url: str, topic: str, source: str, target: str) -> None:
    from danube.metadata import keys
    from danube.metadata.etcd import EtcdMetadataStore
    from danube.metadata.store import Op

    store = EtcdMetadataStore(etcd_url)
    try:
        marker = {"reason": "rebalance", "from_broker": source, "to_broker": target, "timestamp": int(time.time())}
        await store.txn([], [Op.put_json(keys.unassigned(topic), marker), Op.delete(keys.broker_topic(source, topic))])
    finally:
        await store.close()


def wait_owner_change(entry_url: str, topic: str, old: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        now = asyncio.run(owner_of(entry_url, topic))
        if now not in (old, ""):
            return now
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic} still on {old}")
        time.sleep(0.05)


def move_steps(log_paths: list[str], topic: str, faults: list[float]) -> dict[str, int]:
    """Median ms from each fault to the first time each traced step of a move happened after it
    (danube.movetrace lines in the brokers' logs), in the order of the medians."""
    events: list[tuple[float, str]] = []
    for path in log_paths:
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.split()
                if "danube.moves:" in parts and len(parts) >= 4 and parts[-3] == topic:
                    events.append((float(parts[-1]), parts[-2]))
    events.sort()
    per_step: dict[str, list[float]] = {}
    for n, t in enumerate(faults):
        horizon = faults[n + 1] if n + 1 < len(faults) else float("inf")
        seen: dict[str, float] = {}
        for when, what in events:
            if t <= when < horizon and what not in seen:
                seen[what] = when - t
        for what, delay in seen.items():
            per_step.setdefault(what, []).append(delay)
    medians = {what: round(statistics.median(d) * 1000) for what, d in per_step.items()}
    return dict(sorted(medians.items(), key=lambda kv: kv[1]))


def run_kind(kind: str, reps: int, ttl: int, trace: bool = False) -> dict:
    base = tempfile.mkdtemp(prefix=f"danube-faults-{kind}-")
    if trace:
        os.environ["DANUBE_TRACE_MOVES"] = "1"  # the brokers log each step of a move (danube.movetrace)
    cluster = LocalCluster(
        brokers=3, base_dir=base, lease_ttl=ttl, load_report_interval=1.0, config=config(base), log_level="WARNING"
    )
    cluster.start(timeout=120)
    proc = None
    try:
        topic = f"/default/bench-{kind}"
        entry = cluster.procs[0]
        if asyncio.run(owner_of(entry.url, topic)) == entry.url:  # the client's broker must stay up
            asyncio.run(unload(entry.admin_url, topic))
            wait_owner_change(entry.url, topic, entry.url)
        ready, stop = os.path.join(base, "ready"), os.path.join(base, "stop")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        proc = subprocess.Popen(
            [CLIENT_PYTHON, SCRIPT, entry.url, topic, "--ready-file", ready, "--stop-file", stop, "--delay-ms", "5"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise RuntimeError(f"client did not start: {proc.communicate()}")
            time.sleep(0.05)
        time.sleep(1.0)
        faults: list[float] = []
        for _ in range(reps):
            owner = asyncio.run(owner_of(entry.url, topic))
            if owner == entry.url:
                asyncio.run(unload(cluster.procs[1].admin_url, topic))
                owner = wait_owner_change(entry.url, topic, owner)
                time.sleep(0.5)
            victim = next(p for p in cluster.procs if p.url == owner)
            faults.append(time.time())
            if kind == "unload":
                asyncio.run(unload(entry.admin_url, topic))
            elif kind == "rebalance":
                target = next(p for p in cluster.procs if p is not victim and p is not entry)
                asyncio.run(rebalance(cluster.etcd.url, topic, victim.broker_id, target.broker_id))
            elif kind == "sigterm":
                victim.stop()
            elif kind == "kill9":
                victim.kill()
            elif kind == "sigstop":
                os.kill(victim.pid, signal.SIGSTOP)
                time.sleep(ttl + 2.5)
                os.kill(victim.pid, signal.SIGCONT)
            if kind in MOVES:
                wait_owner_change(entry.url, topic, owner)
                time.sleep(0.5)
            else:
                wait_owner_change(entry.url, topic, owner, timeout=ttl + 30)
                time.sleep(1.0)
                if not victim.alive():
                    victim.start(timeout=60)
                time.sleep(ttl + 1.0)  # its old registration expired and it registered again
        time.sleep(1.0)
        open(stop, "w").close()
        out, err = proc.communicate(timeout=120)
        result = json.loads(out.strip().splitlines()[-1])
        steps = move_steps([p.log_path for p in cluster.procs], topic, faults) if trace else None
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.stop()
    acked = result["acked"]
    stalls = []
    for n, t in enumerate(faults):
        horizon = faults[n + 1] if n + 1 < len(faults) else float("inf")
        waits = [end - start for _, start, end in acked if end >= t and start < horizon]
        stalls.append(max(waits) if waits else float("nan"))
    ok_at: dict[int, float] = {}
    for offset, t in result.get("consumer_acks", []):
        ok_at.setdefault(offset, t)
    # copies delivered after a fault although the consumer's ack was answered OK before it
    after_ok = sum(
        1 for r in result["received"] if r[0] in ok_at and len(r) > 2 and any(ok_at[r[0]] < f < r[2] for f in faults)
    )
    delivered = {r[1] for r in result["received"]}
    offsets = [r[0] for r in result["received"]]
    stalls_sorted = sorted(stalls)
    return {
        "fault": kind,
        "reps": len(faults),
        "lease_ttl_s": ttl,
        "stall_p50_ms": round(statistics.median(stalls) * 1000),
        "stall_p99_ms": round(stalls_sorted[min(len(stalls) - 1, int(0.99 * len(stalls)))] * 1000),
        "stall_max_ms": round(max(stalls) * 1000),
        "acked": len(acked),
        "lost": sum(1 for i, _, _ in acked if f"p-{i}" not in delivered),
        "redelivered": len(offsets) - len(set(offsets)),
        "redelivered_after_ok_ack": after_ok,
        "errors": result["errors"] + result["ack_errors"] + result["loop_errors"],
        **({"step_ms_p50": steps} if steps is not None else {}),
    }


async def _sends(url: str, topic: str, count: int, concurrency: int, owner: str | None) -> tuple[float, float]:
    """(messages/s, p50 ms) of Danube's SendMessage to ``url``; ``owner``: sent with the proxy header."""
    metadata = (("x-danube-broker-url", owner),) if owner else None
    async with grpc.aio.insecure_channel(url.split("//")[1]) as ch:
        stub = pb_grpc.ProducerServiceStub(ch)
        created = await stub.CreateProducer(
            pb.ProducerRequest(
                request_id=1,
                producer_name=f"hop-{bool(owner)}",
                topic_name=topic,
                producer_access_mode=pb.Shared,
                dispatch_strategy=pb.Reliable,
            ),
            metadata=metadata,
            timeout=60,
        )
        latencies: list[float] = []

        async def worker(n: int) -> None:
            for i in range(n):
                msg = pb.StreamMessage(
                    request_id=i,
                    msg_id=pb.MsgID(producer_id=created.producer_id, topic_name=topic),
                    payload=b"x" * 100,
                    publish_time=int(time.time() * 1000),
                    producer_name=f"hop-{bool(owner)}",
                )
                t = time.perf_counter()
                await stub.SendMessage(msg, metadata=metadata, timeout=60)
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return len(latencies) / elapsed, statistics.median(latencies) * 1000


def proxy_cost(count: int, rounds: int) -> dict:
    """The extra hop of proxy mode: Danube's SendMessage straight to the owner vs through another broker
    (alternated rounds, median), 1 and 32 calls in flight."""
    base = tempfile.mkdtemp(prefix="danube-faults-hop-")
    cluster = LocalCluster(
        brokers=3, base_dir=base, lease_ttl=10, load_report_interval=1.0, config=config(base), log_level="WARNING"
    )
    cluster.start(timeout=120)
    try:
        topic = "/default/bench-hop"
        owner = asyncio.run(owner_of(cluster.procs[0].url, topic))
        other = next(p.url for p in cluster.procs if p.url != owner)
        row = {"fault": "proxy_hop"}
        for concurrency in (1, 32):
            direct, via = [], []
            for _ in range(rounds):
                direct.append(asyncio.run(_sends(owner, topic, count, concurrency, None)))
                via.append(asyncio.run(_sends(other, topic, count, concurrency, owner)))
            d_rate, v_rate = statistics.median(r for r, _ in direct), statistics.median(r for r, _ in via)
            row[f"c{concurrency}"] = {
                "direct_msgs_s": round(d_rate),
                "proxied_msgs_s": round(v_rate),
                "ratio": round(v_rate / d_rate, 2),
                "direct_p50_ms": round(statistics.median(p for _, p in direct), 2),
                "proxied_p50_ms": round(statistics.median(p for _, p in via), 2),
            }
        return row
    finally:
        cluster.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", default="unload,rebalance,sigterm,kill9,sigstop")
    p.add_argument("--reps", type=int, default=20, help="repetitions of unload and rebalance")
    p.add_argument("--kill-reps", type=int, default=5, help="repetitions of sigterm, kill9 and sigstop")
    p.add_argument("--lease-ttl", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--hop", action="store_true", help="also measure the proxy hop's cost (SendMessage rate)")
    p.add_argument("--hop-count", type=int, default=2000)
    p.add_argument(
        "--trace",
        action="store_true",
        help="per move, the median time from the fault to each step (brokers' DANUBE_TRACE_MOVES logs)",
    )
    a = p.parse_args()
    if not os.path.exists(CLIENT_PYTHON):
        print(f"danube-client venv missing ({CLIENT_PYTHON}): run the e2e tests once to create it", file=sys.stderr)
        return 2
    rows = []
    if a.hop:
        row = proxy_cost(a.hop_count, 3)
        print(json.dumps(row), flush=True)
    for kind in filter(None, a.faults.split(",")):
        row = run_kind(kind, a.reps if kind in MOVES else a.kill_reps, a.lease_ttl, a.trace)
        rows.append(row)
        if a.json:
            print(json.dumps(row))
        else:
            print(
                f"{kind:10s} reps {row['reps']:3d}  stall p50 {row['stall_p50_ms']:6d} ms  p99 "
                f"{row['stall_p99_ms']:6d} ms  max {row['stall_max_ms']:6d} ms  acked {row['acked']:6d}  "
                f"lost {row['lost']}  redelivered {row['redelivered']} (after an OK ack: "
                f"{row['redelivered_after_ok_ack']})  errors {len(row['errors'])}"
                + (f"  first error: {row['errors'][0][:200]}" if row["errors"] else ""),
                flush=True,
            )
            if "step_ms_p50" in row:
                print(
                    "           steps (ms after the fault, p50): "
                    + ", ".join(f"{k} {v}" for k, v in row["step_ms_p50"].items()),
                    flush=True,
                )
    return 1 if any(r["lost"] or r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
