"""Many active topics with small batches: danube, NATS JetStream and Redis Streams side by side.

    bash bench/peers/setup.sh                 # once: nats-server, redis-server, nats-py, redis
    python -m bench.peers.many_topics --sync always [--topics 100] [--rate 25000] [--pace-ms 10]
        [--duration 5] [--connections 8] [--only danube --only nats --only redis]

For each sync mode, 1 topic and then ``--topics`` topics, each system on a fresh server of its own
(free loopback ports, stopped by PID), in one run:

- danube: ``danube broker --sync S`` driven by ``danube bench --service-url URL --broker-pid PID
  --rate R --pace-ms P`` (and ``--topics N --producers N --consumers N --connections C``), exactly
  what ``bench/many_topics.py`` runs;
- NATS JetStream: ``nats-server -js``, one stream per topic (file storage), one durable pull
  consumer per stream (AckPolicy.ALL, the last message of each fetch acked);
- Redis Streams: ``redis-server --appendonly yes --appendfsync always|everysec|no`` (danube's
  always|interval|never), one stream per topic, ``XADD`` pipelined per call, one group per stream
  read with ``XREADGROUP`` and acked with one ``XACK`` per read.

The peers are driven the way ``danube bench`` drives danube: the producers in this process (one
uvloop event loop), the consumers in a child process of their own; producer i writes topic
i mod N, consumer j reads topic j mod N; each producer is paced to R/N msgs/s, one call every
``--pace-ms`` carrying that interval's messages (``danube.cli.bench_parts.messages_per_call``: 2 a call
at 25,000 msgs/s over 100 producers), each payload stamped with the call's ``perf_counter``;
every delivered message is sampled.  Producers and consumers share the ``--connections`` as
danube's do (NATS multiplexes; Redis has no multiplexing, so redis-py's pools open a connection
per command in flight and per blocked reader, and the table says how many the server saw).
Printed per row: delivered msgs/s (and the share of the offered rate), publish->deliver p50/p99,
and the SERVER's CPU (user + system from /proc/<pid>/stat, from the first send to the last
delivery) per acked message and per producer call.  JSON in bench/out/.  See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import time
import traceback

from bench.peers.common import STAMP, sent_at
from danube.cli._machine import describe, observe
from danube.processes import cpu_seconds, thread_count

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")
OUT_DIR = os.path.join(ROOT, "bench", "out")
SYSTEMS = ("danube", "nats", "redis")
FETCH = 1000  # most messages one NATS fetch / one XREADGROUP returns
WINDOW = 64  # producer calls in flight per producer
DRAIN_TIMEOUT = 30.0  # as danube bench's: how long the consumers may lag once producing ended


def _loop_runner() -> asyncio.Runner:
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.Runner()


def _share(count: int, connections: int, share: float) -> int:
    """Connections for one side: as danube bench splits ``--connections`` (one when not given)."""
    return 1 if connections <= 0 else max(1, min(count, round(connections * share)))


def topic_names(system: str, topics: int) -> list[str]:
    if system == "nats":
        return [f"BENCH{t}" for t in range(topics)]
    return [f"bench-{t}" for t in range(topics)]


# ------------------------------------------------------------------ the two peers' clients


class NatsSide:
    """One side's NATS connections; stream t has subject ``bench.t`` and a durable ``bench``."""

    window = WINDOW  # publish_async pipelines calls on a connection, as danube's producers do

    def __init__(self, url: str, shape: dict, connections: int, users: int) -> None:
        self.url, self.shape, self.n_conn, self.users = url, shape, connections, users
        self.conns: list = []
        self.js: list = []

    async def open(self) -> None:
        import nats

        for _ in range(self.n_conn):
            nc = await nats.connect(self.url)
            self.conns.append(nc)
            self.js.append(nc.jetstream(publish_async_max_pending=WINDOW * 1000))

    async def prepare(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType

        js = self.js[0]
        for t, name in enumerate(topic_names("nats", self.shape["topics"])):
            await js.add_stream(name=name, subjects=[f"bench.{t}"], storage=StorageType.FILE)
            await js.add_consumer(
                name, ConsumerConfig(durable_name="bench", ack_policy=AckPolicy.ALL, max_ack_pending=-1)
            )

    def sender(self, i: int):
        js = self.js[i % len(self.js)]
        subject = f"bench.{i % self.shape['topics']}"

        async def publish(data: bytes, n: int) -> None:
            futures = [await js.publish_async(subject, data) for _ in range(n)]
            await asyncio.gather(*futures)

        def send(data: bytes, n: int) -> asyncio.Future:
            return asyncio.ensure_future(publish(data, n))

        return send

    def readers(self) -> int:
        return self.users  # a pull subscription per consumer, all on the side's connections

    async def consume(self, j: int, on_batch, finished, subscribed: asyncio.Semaphore) -> None:
        import nats.errors

        js = self.js[j % len(self.js)]
        stream = topic_names("nats", self.shape["topics"])[j % self.shape["topics"]]
        sub = await js.pull_subscribe_bind(durable="bench", stream=stream)
        subscribed.release()
        while not finished():
            try:
                msgs = await sub.fetch(batch=FETCH, timeout=0.1)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nothing within the fetch's wait
                continue
            if not msgs:
                continue
            on_batch([m.data for m in msgs])
            await msgs[-1].ack()

    async def connections_seen(self) -> int | None:
        return None  # a NATS connection multiplexes: the clients opened exactly n_conn each side

    async def close(self) -> None:
        for nc in self.conns:
            with contextlib.suppress(Exception):
                await nc.close()


class _AutoPipeline:
    """Every XADD the producers of one connection hand over while its last pipeline is out goes
    in its next one: one round trip in flight per connection, like ioredis's auto-pipelining.
    (A Redis connection answers one command or pipeline at a time; a pool would open a
    connection per call in flight instead.)"""

    def __init__(self, client) -> None:
        self.client = client
        self.pending: list = []
        self.flushing = False

    def send(self, key: str, data: bytes, n: int) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((key, data, n, future))
        if not self.flushing:
            self.flushing = True
            asyncio.ensure_future(self._flush())
        return future

    async def _flush(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                pipe = self.client.pipeline(transaction=False)
                for key, data, n, _ in batch:
                    for _ in range(n):
                        pipe.xadd(key, {"d": data})
                try:
                    await pipe.execute()
                except Exception as exc:  # noqa: BLE001 - every call of the pipeline fails with it
                    for *_, future in batch:
                        future.set_exception(exc)
                    continue
                for *_, future in batch:
                    future.set_result(None)
        finally:
            self.flushing = False


class RedisSide:
    """One side's redis-py clients (one connection each, one spare); stream t is ``bench-t``,
    group ``bench``.  Producers share a connection through ``_AutoPipeline``; the consumers of one
    connection are one reader: a blocked XREADGROUP holds its connection, so one call reads
    all of that connection's streams (STREAMS k1 k2 ...) and one pipeline acks them."""

    window = WINDOW

    def __init__(self, url: str, shape: dict, connections: int, users: int) -> None:
        self.url, self.shape, self.n_conn, self.users = url, shape, connections, users
        self.clients: list = []
        self.pipes: list = []

    async def open(self) -> None:
        import redis.asyncio as redis

        self.clients = [redis.from_url(self.url, max_connections=2) for _ in range(self.n_conn)]
        await asyncio.gather(*(c.ping() for c in self.clients))
        self.pipes = [_AutoPipeline(c) for c in self.clients]

    async def prepare(self) -> None:
        client = self.clients[0]
        for key in topic_names("redis", self.shape["topics"]):
            await client.delete(key)
            await client.xgroup_create(key, "bench", id="$", mkstream=True)

    def sender(self, i: int):
        pipe = self.pipes[i % len(self.pipes)]
        key = topic_names("redis", self.shape["topics"])[i % self.shape["topics"]]

        def send(data: bytes, n: int) -> asyncio.Future:
            return pipe.send(key, data, n)

        return send

    def readers(self) -> int:
        return self.n_conn

    async def consume(self, k: int, on_batch, finished, subscribed: asyncio.Semaphore) -> None:
        client = self.clients[k]
        names = topic_names("redis", self.shape["topics"])
        # consumer j reads topic j mod N; this connection carries the consumers j = k mod n_conn
        keys = sorted({names[j % len(names)] for j in range(k, self.users, self.n_conn)})
        streams = dict.fromkeys(keys, ">")
        subscribed.release()
        while not finished():
            answer = await client.xreadgroup("bench", f"r{k}", streams, count=FETCH, block=100)
            if not answer:
                continue
            acks = client.pipeline(transaction=False)
            for key, entries in answer:
                on_batch([fields[b"d"] for _, fields in entries])
                acks.xack(key, "bench", *[entry_id for entry_id, _ in entries])
            await acks.execute()

    async def connections_seen(self) -> int | None:
        info = await self.clients[0].info("clients")
        return int(info["connected_clients"])

    async def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await c.aclose()


SIDES = {"nats": NatsSide, "redis": RedisSide}

# ------------------------------------------------------------------ the consumer child process


async def _child_main(spec: dict) -> dict:
    from danube.cli.bench_config import percentiles
    from danube.cli.bench_consumers import quiet_gc

    shape = spec["shape"]
    n_cons = shape["consumers"]
    side = SIDES[spec["system"]](spec["url"], shape, _share(n_cons, shape["connections"], 0.5), n_cons)
    await side.open()
    latencies: list[float] = []
    seen = {"delivered": 0, "last": 0.0}
    target: list = [None, 0.0]
    perf = time.perf_counter

    def on_batch(payloads: list) -> None:
        now = perf()
        latencies.extend([now - sent_at(d) for d in payloads])
        seen["delivered"] += len(payloads)
        seen["last"] = now

    def finished() -> bool:
        if target[0] is None:
            return False
        return seen["delivered"] >= target[0] or perf() - target[1] > DRAIN_TIMEOUT

    async def read_target() -> None:
        line = await asyncio.to_thread(sys.stdin.readline)
        target[0], target[1] = int(line), perf()

    subscribed = asyncio.Semaphore(0)  # released by each consumer once it can receive
    readers = side.readers()
    tasks = [asyncio.ensure_future(side.consume(j, on_batch, finished, subscribed)) for j in range(readers)]

    async def all_subscribed() -> None:
        for _ in range(readers):
            await subscribed.acquire()

    waiter = asyncio.ensure_future(all_subscribed())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():  # a consumer ended before subscribing: its error says why
        waiter.cancel()
        failed = next(t for t in tasks if t.done())
        await side.close()
        raise RuntimeError(f"a consumer could not subscribe: {failed.exception()!r}")
    errors: list[str] = []
    try:
        with quiet_gc():
            print("ready", flush=True)
            await read_target()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    where = traceback.extract_tb(result.__traceback__)[-1]
                    errors.append(f"{result!r} at {os.path.basename(where.filename)}:{where.lineno}"[:300])
    finally:
        await side.close()
    return {
        "delivered": seen["delivered"],
        "last": seen["last"],
        "latency": percentiles(latencies),
        "errors": errors[:2],
    }


def child_entry() -> None:
    spec = json.loads(sys.stdin.readline())
    with _loop_runner() as runner:
        try:
            answer = runner.run(_child_main(spec))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which owns the outcome
            answer = {"errors": [f"consumer process: {exc!r}"[:500]]}
    print(json.dumps(answer), flush=True)


class ConsumerChild:
    """The consumers in a fresh interpreter, spoken to in JSON lines over its stdin/stdout."""

    def __init__(self, system: str, url: str, shape: dict) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, SRC])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.peers.many_topics", "--consumer-child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self._send({"system": system, "url": url, "shape": shape})

    def _send(self, obj) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    async def _line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        if not line:
            raise RuntimeError(f"the consumer process exited (code {self.proc.poll()})")
        return line

    async def ready(self) -> None:
        line = await self._line(120)
        if line.strip() != "ready":
            raise RuntimeError(f"the consumer process failed: {line.strip()[:500]}")

    async def finish(self, acked: int) -> dict:
        self._send(acked)
        return json.loads(await self._line(DRAIN_TIMEOUT + 30))

    def stop(self) -> None:
        from danube.processes import stop_process

        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stop_process(self.proc, 5)


# ------------------------------------------------------------------ the producer side (this process)


async def run_peer(system: str, url: str, pid: int, shape: dict) -> dict:
    """One row: ``shape``'s producers here, its consumers in a child, ``pid``'s CPU over the run."""
    from danube.cli.bench_config import BenchConfig
    from danube.cli.bench_consumers import quiet_gc
    from danube.cli.bench_parts import messages_per_call

    n_prod = shape["producers"]
    per_call = messages_per_call(
        BenchConfig(rate=shape["rate"], producers=n_prod, pace_ms=shape["pace_ms"], batch_size=1000)
    )
    side = SIDES[system](url, shape, _share(n_prod, shape["connections"], 0.5), n_prod)
    await side.open()
    await side.prepare()
    child = ConsumerChild(system, url, shape)
    counts = {"sent": 0, "acked": 0, "calls": 0}
    errors: list[str] = []
    perf = time.perf_counter
    pad = b"\x00" * max(0, shape["message_size"] - STAMP.size)

    async def produce(i: int, deadline: float, per_rate: float) -> None:
        send = side.sender(i)
        window = asyncio.Semaphore(side.window)
        started = perf()
        sent = 0
        while perf() < deadline:
            data = STAMP.pack(perf()) + pad
            await window.acquire()
            call = send(data, per_call)
            counts["sent"] += per_call
            counts["calls"] += 1
            sent += per_call

            def done(f, n=per_call):
                window.release()
                if f.cancelled() or f.exception() is not None:
                    if not f.cancelled() and len(errors) < 5:
                        errors.append(repr(f.exception())[:300])
                    return
                counts["acked"] += n

            call.add_done_callback(done)
            delay = started + sent / per_rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
        while window._value < side.window:  # every call answered
            await asyncio.sleep(0.01)

    row: dict = {"system": system, "messages_per_call": per_call}
    try:
        await child.ready()
        with quiet_gc(), observe() as machine:
            cpu0 = cpu_seconds(pid)
            start = perf()
            deadline = start + shape["duration"]
            await asyncio.gather(*(produce(i, deadline, shape["rate"] / n_prod) for i in range(n_prod)))
            produced_s = perf() - start
            connections = await side.connections_seen()
            answer = await child.finish(counts["acked"])
            cpu = cpu_seconds(pid) - cpu0
        delivered = answer.get("delivered", 0)
        if delivered < counts["acked"]:
            errors.append(f"only {delivered} of {counts['acked']} acked messages were delivered")
        lat = answer.get("latency") or {}
        row.update(
            sent=counts["sent"],
            acked=counts["acked"],
            delivered=delivered,
            delivered_per_s=round(delivered / max(answer.get("last", 0.0) - start, 1e-9), 1),
            of_offered=None,
            p50_ms=lat.get("p50"),
            p99_ms=lat.get("p99"),
            cpu_us_msg=round(cpu * 1e6 / max(1, counts["acked"]), 2),
            cpu_us_call=round(cpu * 1e6 / max(1, counts["calls"]), 2),
            calls_s=round(counts["calls"] / produced_s, 1),
            threads=thread_count(pid),
            connections=connections if connections is not None else 2 * side.n_conn,
            machine=describe(machine),
            errors=(errors + answer.get("errors", []))[:3],
        )
    finally:
        await side.close()
        await asyncio.to_thread(child.stop)
    return row


def run_danube(sync: str, shape: dict) -> dict:
    """``bench/many_topics.py``'s run: a fresh ``danube broker`` and ``danube bench --broker-pid``."""
    from bench.many_topics import run_one

    args = ["--duration", str(shape["duration"]), "--pace-ms", str(shape["pace_ms"]), "--rate", str(shape["rate"])]
    if shape["topics"] > 1:
        n = str(shape["topics"])
        args += ["--topics", n, "--producers", n, "--consumers", n, "--connections", str(shape["connections"])]
    r = run_one(SRC, sync, args, timeout=shape["duration"] + 150 + shape["topics"])
    lat = r.get("deliver_latency_ms") or {}
    return {
        "system": "danube",
        "messages_per_call": r.get("messages_per_call"),
        "sent": r.get("sent"),
        "acked": r.get("acked"),
        "delivered": r.get("delivered"),
        "delivered_per_s": r.get("end_to_end_rate"),
        "p50_ms": lat.get("p50"),
        "p99_ms": lat.get("p99"),
        "cpu_us_msg": r.get("broker_cpu_us_per_msg"),
        "cpu_us_call": r.get("broker_cpu_us_per_call"),
        "calls_s": r.get("calls_per_s"),
        "threads": r.get("broker_threads"),
        "connections": shape["connections"] or 2,
        "machine": describe(r["machine"]) if r.get("machine") else "",
        "errors": (r.get("errors") or [])[:3],
    }


def run_system(system: str, sync: str, shape: dict) -> dict:
    if system == "danube":
        row = run_danube(sync, shape)
    else:
        from bench.peers import nats_peer, redis_peer

        server = (
            nats_peer.nats_server_process()
            if system == "nats"
            else redis_peer.redis_server_process(redis_peer.APPENDFSYNC[sync])
        )
        with server as (url, pid), _loop_runner() as runner:
            row = runner.run(run_peer(system, url, pid, shape))
    row["of_offered"] = round((row.get("delivered_per_s") or 0) / shape["rate"], 3)
    return {"sync": sync, "topics": shape["topics"], **row}


def server_label(system: str, sync: str) -> str:
    if system == "danube":
        return f"danube broker --sync {sync}"
    if system == "nats":
        return "nats-server -js (file store; no per-write fsync in 2.9)"
    from bench.peers.redis_peer import APPENDFSYNC

    return f"redis-server appendfsync {APPENDFSYNC[sync]}"


def table(rows: list[dict]) -> str:
    head = (
        f"{'sync':<9} {'topics':>6} {'system':<7} {'delivered/s':>11} {'offered':>7} {'p50 ms':>9} {'p99 ms':>9} "
        f"{'CPU us/msg':>10} {'us/call':>8} {'calls/s':>8} {'thr':>4} {'conns':>5}"
    )
    lines = [head, "-" * len(head)]

    def cell(r: dict, key: str, fmt: str) -> str:
        v = r.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in rows:
        f = functools.partial(cell, r)
        lines.append(
            f"{r['sync']:<9} {r['topics']:>6} {r['system']:<7} {f('delivered_per_s', ',.0f'):>11} "
            f"{f('of_offered', '.0%'):>7} {f('p50_ms', '.1f'):>9} {f('p99_ms', '.1f'):>9} "
            f"{f('cpu_us_msg', '.1f'):>10} {f('cpu_us_call', '.0f'):>8} {f('calls_s', ',.0f'):>8} "
            f"{f('threads', 'd'):>4} {f('connections', 'd'):>5}"
        )
        for e in r.get("errors") or []:
            lines.append(f"    error: {e}")
    return "\n".join(lines)


def ratios(rows: list[dict], n: int) -> list[str]:
    out = []
    for sync in dict.fromkeys(r["sync"] for r in rows):
        by = {(r["system"], r["topics"]): r for r in rows if r["sync"] == sync}
        for system in SYSTEMS:
            one, many = by.get((system, 1)), by.get((system, n))
            if one and many and one.get("cpu_us_msg") and many.get("cpu_us_msg"):
                out.append(
                    f"{sync:<9} {system:<7} server CPU/msg, {n} topics / 1 topic = "
                    f"{many['cpu_us_msg'] / one['cpu_us_msg']:.2f}"
                )
        for topics in (1, n):
            d = by.get(("danube", topics))
            for peer in ("nats", "redis"):
                p = by.get((peer, topics))
                if d and p and d.get("cpu_us_msg") and p.get("cpu_us_msg"):
                    out.append(
                        f"{sync:<9} {topics:>4} topic(s): danube's server CPU/msg / {peer}'s = "
                        f"{d['cpu_us_msg'] / p['cpu_us_msg']:.2f}"
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:] == ["--consumer-child"]:
        child_entry()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sync", nargs="+", choices=["always", "interval", "never"], default=["always"])
    ap.add_argument("--topics", type=int, default=100, help="the many-topics shape (with 1 topic beside it)")
    ap.add_argument("--rate", type=float, default=25000.0, help="msgs/s offered in total")
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=8, help="client connections at --topics (1 topic: 1 each)")
    ap.add_argument("--message-size", type=int, default=100)
    ap.add_argument("--only", action="append", choices=SYSTEMS, help="run only these (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    ap.add_argument("--json-out", default=None, help="where the JSON goes (default bench/out/many-topics-peers-*.json)")
    args = ap.parse_args(argv)
    if args.topics < 2 or args.rate <= 0 or args.duration <= 0 or args.message_size < STAMP.size:
        ap.error("--topics must be at least 2, --rate and --duration positive, --message-size at least 8")
    systems = [s for s in SYSTEMS if s in (args.only or SYSTEMS)]
    skipped = []
    for system, binary in (("nats", "nats-server"), ("redis", "redis-server")):
        if system in systems and shutil.which(binary) is None:
            systems.remove(system)
            skipped.append(f"{system}: {binary} is not installed (bash bench/peers/setup.sh)")
    shapes = [
        {"topics": t, "producers": t, "consumers": t, "connections": c}
        for t, c in ((1, 0), (args.topics, args.connections))
    ]
    common = {"rate": args.rate, "pace_ms": args.pace_ms, "duration": args.duration, "message_size": args.message_size}
    rows = []
    for sync in args.sync:
        for k, shape in enumerate(shapes):
            # alternate the order so no system always runs first (on a shared machine the load drifts)
            for system in systems if k % 2 == 0 else list(reversed(systems)):
                print(f"{sync}: {shape['topics']} topic(s): {server_label(system, sync)} ...", file=sys.stderr)
                row = run_system(system, sync, {**shape, **common})
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
    print(table(rows))
    for line in ratios(rows, args.topics):
        print(line)
    for s in skipped:
        print(f"skipped {s}")
    path = args.json_out or os.path.join(OUT_DIR, f"many-topics-peers-{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "skipped": skipped}, f, indent=2)
    print(f"JSON: {os.path.relpath(path)}")
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
