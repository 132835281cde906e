"""The bench's consumer side at many topics with small batches: its CPU per delivered batch.

    python bench/client_consume_calls.py --before /tmp/before/src [--broker-src SRC] [--producer-src SRC]
        [--rounds 2] [--topics 100] [--rate 25000] [--pace-ms 10] [--duration 8] [--connections 8]

Each run gets a fresh broker (``--sync never``, from ``--broker-src``), then a consumer process
(this tree's client and ``danube bench``'s consume loop, or the ``--before`` tree's) subscribes
one exclusive consumer per topic, and a producer process (``--producer-src``'s client) sends
``--rate`` msgs/s over ``--topics`` topics paced like ``danube bench --pace-ms`` (2 messages per
call at the defaults).  The consumer process measures its own CPU (every thread, user + system)
from 1 s after producing starts until it ends, and the batches and messages it delivered in that
window.  Trees alternate which goes first in each round, so the ratio compares runs made
seconds apart.  Prints one JSON line per run (with the requests the consumers wrote per delivered
batch: acks and credit grants), then the median of each tree and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
WARMUP_S = 1.0  # the window starts this long after producing starts
QUIET_S = 1.0  # the consumers stop once nothing arrived for this long after producing ended


def _config(args):
    from danube.cli.bench_config import BenchConfig

    return BenchConfig(
        service_url=args.url,
        producers=args.topics,
        consumers=args.topics,
        topics=args.topics,
        connections=args.connections,
        rate=args.rate,
        pace_ms=args.pace_ms,
        duration=args.duration,
        progress=False,
    )


def _sleep_until_wall(at: float):
    return asyncio.sleep(max(0.0, at - time.time()))


class _Pipe:
    """Stands in for the pipe ``danube bench`` talks to its consumer process over: "ready" goes to
    stdout, the acked count to reach comes as the second line of stdin (after the start time)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self.lines.append(line)

    def send(self, message) -> None:
        print(message, flush=True)

    def poll(self) -> bool:
        return len(self.lines) >= 2

    def recv(self) -> int:
        return int(self.lines[1])


class _Cell:
    value = 0


async def consume_role(args) -> dict:
    """``danube bench``'s consumer process main (this tree's or ``--before``'s), measured in a window."""
    from danube import _allocator
    from danube.cli import bench_consumers as bc

    _allocator.tune()  # as the bench's consumer process does
    batches = [0]
    build = bc.build_consumers

    def counted_consumers(*a, **k):  # counts deliveries the same way for either tree
        consumers = build(*a, **k)
        for c in consumers:

            def counted(batch, deliver=c.deliver):
                batches[0] += 1
                deliver(batch)

            c.deliver = counted
        return consumers

    bc.build_consumers = counted_consumers
    import grpc.aio._call as aio_call

    writes = [0]
    write = aio_call._StreamRequestMixin.write

    def counted_write(self, request):  # every request a consumer writes (acks, credit); no extra frame
        writes[0] += 1
        return write(self, request)

    aio_call._StreamRequestMixin.write = counted_write
    config = _config(args)
    pipe = _Pipe()
    window: dict = {}
    cell = _Cell()  # the delivered count, as the consumer process reports it every 10 ms

    async def measure() -> None:
        while not pipe.lines:
            await asyncio.sleep(0.05)
        start_at = float(pipe.lines[0])
        await _sleep_until_wall(start_at + WARMUP_S)
        cpu0, batches0, msgs0, writes0 = time.process_time(), batches[0], cell.value, writes[0]
        await _sleep_until_wall(start_at + config.duration)
        window.update(
            cpu_s=time.process_time() - cpu0,
            batches=batches[0] - batches0,
            msgs=cell.value - msgs0,
            writes=writes[0] - writes0,
        )

    measuring = asyncio.ensure_future(measure())
    answer = await bc._consumer_child_main(pipe, cell, config, args.topic, "exclusive")
    await measuring
    samples = sorted(answer["latencies"])
    p99 = samples[int(0.99 * (len(samples) - 1))] * 1000 if samples else None
    return {"delivered": answer["delivered"], "p99_ms": p99, "seconds": config.duration - WARMUP_S, **window}


async def produce_role(args) -> dict:
    """``--topics`` producers paced like ``danube bench --rate --pace-ms`` from ``--start-at``."""
    from danube.cli.bench import messages_per_call
    from danube.cli.bench_config import STAMP, bench_clients, bench_topics, connection_shares

    config = _config(args)
    per_call = messages_per_call(config)
    clients = bench_clients(config, config.producers, connection_shares(config)[0])
    topics = bench_topics(config, args.topic)
    producers = [
        clients[i % len(clients)]
        .new_producer()
        .with_topic(topics[i % len(topics)])
        .with_name(f"ccc-p{i}")
        .with_reliable(True)
        .build()
        for i in range(config.producers)
    ]
    await asyncio.gather(*(p.create() for p in producers))
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    counts = {"acked": 0, "calls": 0, "errors": 0}
    pad = b"\x00" * (config.message_size - STAMP.size)
    per_producer = config.rate / config.producers

    async def produce(producer) -> None:
        await _sleep_until_wall(start_at)
        window = asyncio.Semaphore(64)
        started = time.perf_counter()
        deadline = started + config.duration
        sent = 0
        while time.perf_counter() < deadline:
            await window.acquire()
            fut = await producer.send_batch([STAMP.pack(time.perf_counter()) + pad] * per_call)
            counts["calls"] += 1
            sent += per_call

            def done(f) -> None:
                window.release()
                if f.cancelled() or f.exception() is not None:
                    counts["errors"] += 1
                else:
                    counts["acked"] += per_call

            fut.add_done_callback(done)
            delay = started + sent / per_producer - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await producer.flush()

    await asyncio.gather(*(produce(p) for p in producers))
    for p in producers:
        await p.close()
    for client in clients:
        await client.close()
    return {**counts, "per_call": per_call}


def _role_main(args) -> None:
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        factory = None
    role = consume_role if args.role == "consume" else produce_role
    with asyncio.Runner(loop_factory=factory) as runner:
        print(json.dumps(runner.run(role(args))), flush=True)


def _start_role(role: str, tree: str, args, url: str, topic: str) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--url", url, "--topic", topic]
    for flag in ("topics", "rate", "pace_ms", "duration", "connections"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = {**os.environ, "PYTHONPATH": tree}
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _expect_ready(proc: subprocess.Popen, what: str) -> None:
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"{what} did not get ready: {line!r}")


def run_once(tree: str, args) -> dict:
    from danube.cli._process import spawned_broker
    from danube.processes import cpu_seconds, stop_process

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = args.broker_src  # the broker child inherits it
    try:
        with spawned_broker("never") as broker:
            topic = f"/default/ccc-{uuid.uuid4().hex[:8]}"
            consumer = _start_role("consume", tree, args, broker.service_url, topic)
            producer = None
            try:
                _expect_ready(consumer, "the consumer process")
                producer = _start_role("produce", args.producer_src, args, broker.service_url, topic)
                _expect_ready(producer, "the producer process")
                start_at = time.time() + 0.5
                for proc in (consumer, producer):
                    proc.stdin.write(f"{start_at}\n")
                    proc.stdin.flush()
                broker_cpu0 = cpu_seconds(broker.proc.pid)
                produced = json.loads(producer.stdout.readline())
                broker_cpu = cpu_seconds(broker.proc.pid) - broker_cpu0
                consumer.stdin.write(f"{produced['acked']}\n")
                consumer.stdin.flush()
                consumed = json.loads(consumer.stdout.readline())
            finally:
                for proc in (consumer, producer):
                    if proc is not None:
                        stop_process(proc, timeout=10)
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    window = consumed["seconds"]
    return {
        "consumer_us_per_batch": round(consumed["cpu_s"] * 1e6 / max(1, consumed["batches"]), 1),
        "consumer_us_per_msg": round(consumed["cpu_s"] * 1e6 / max(1, consumed["msgs"]), 1),
        "consumer_cores": round(consumed["cpu_s"] / window, 3),
        "msgs_per_batch": round(consumed["msgs"] / max(1, consumed["batches"]), 2),
        "writes_per_batch": round(consumed["writes"] / max(1, consumed["batches"]), 3),
        "delivered_per_s": round(consumed["msgs"] / window),
        "p99_ms": None if consumed["p99_ms"] is None else round(consumed["p99_ms"], 1),
        "acked": produced["acked"],
        "delivered": consumed["delivered"],
        "lost": produced["acked"] - consumed["delivered"],
        "broker_cpu_s": round(broker_cpu, 2),
        "load": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["consume", "produce"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--url", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--topic", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--before", default=None, help="src dir of the consumer tree to compare with")
    ap.add_argument("--broker-src", default=SRC, help="src dir the broker runs from (default: this tree)")
    ap.add_argument("--producer-src", default=None, help="src dir the producers run from (default: --broker-src)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--rate", type=float, default=25000.0)
    ap.add_argument("--pace-ms", type=float, default=10.0)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    if args.role:
        _role_main(args)
        return
    sys.path.insert(0, args.broker_src)
    args.broker_src = os.path.abspath(args.broker_src)
    args.producer_src = os.path.abspath(args.producer_src or args.broker_src)
    trees = [("after", SRC)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    rows: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for i in range(args.rounds):
        for name, tree in trees if i % 2 == 0 else list(reversed(trees)):
            row = run_once(tree, args)
            rows[name].append(row)
            print(json.dumps({"tree": name, "round": i, **row}), flush=True)
    medians = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("consumer_us_per_batch", "consumer_us_per_msg")}
        for name, runs in rows.items()
    }
    print(json.dumps({"median": medians}))
    if args.before:
        print(
            json.dumps(
                {
                    "after/before us per batch": round(
                        medians["after"]["consumer_us_per_batch"] / medians["before"]["consumer_us_per_batch"], 3
                    )
                }
            )
        )


if __name__ == "__main__":
    main()
