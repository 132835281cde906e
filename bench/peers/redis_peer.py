"""Redis Streams (Debian redis-server, AOF everysec) driven by redis-py asyncio with batching.

Producer: pipelined XADD, ``batch`` per round trip.  Consumer: XREADGROUP COUNT
``batch`` then one XACK with every id it got.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time

from bench.peers.common import PeerResult, free_port, paced_chunk, payload, percentiles, sent_at, server_process

STREAM, GROUP = "bench", "bench-group"


# danube's sync modes and Redis's AOF policies that mean the same: fsync before answering, about
# once a second, never (left to the kernel).
APPENDFSYNC = {"always": "always", "interval": "everysec", "never": "no"}


@contextlib.contextmanager
def redis_server_process(appendfsync: str = "everysec"):
    """(url, server pid) of a redis-server with an append-only file in a temporary directory."""
    port = free_port()
    data = tempfile.mkdtemp(prefix="redis-bench-")
    cmd = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        data,
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--save",
        "",
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
    ]
    try:
        with server_process(cmd, port) as proc:
            yield f"redis://127.0.0.1:{port}", proc.pid
    finally:
        shutil.rmtree(data, ignore_errors=True)


@contextlib.contextmanager
def redis_server():
    with redis_server_process("everysec") as (url, _pid):
        yield url


async def run(
    url: str, *, message_size: int, duration: float, rate: float = 0.0, batch: int = 1000, window: int = 4
) -> PeerResult:
    import redis.asyncio as redis

    producer_conn = redis.from_url(url)
    consumer_conn = redis.from_url(url)
    await producer_conn.delete(STREAM)
    await producer_conn.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    result = PeerResult("redis-streams", "max" if rate <= 0 else f"rate={rate:.0f}")
    deliver_lat: list[float] = []
    counts = {"sent": 0, "acked": 0, "delivered": 0}
    done_producing = asyncio.Event()
    perf = time.perf_counter

    async def consume():
        last = perf()
        while True:
            answer = await consumer_conn.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=batch, block=200)
            if not answer:
                if done_producing.is_set() and counts["delivered"] >= counts["acked"]:
                    return last
                continue
            entries = answer[0][1]
            now = last = perf()
            deliver_lat.extend([now - sent_at(e[1][b"d"]) for e in entries])  # every message sampled
            counts["delivered"] += len(entries)
            await consumer_conn.xack(STREAM, GROUP, *[e[0] for e in entries])

    async def produce_pipeline(n: int):
        data = payload(message_size, perf())
        pipe = producer_conn.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd(STREAM, {"d": data})
        await pipe.execute()
        counts["acked"] += n

    consumer = asyncio.ensure_future(consume())
    start = perf()
    deadline = start + duration
    chunk = paced_chunk(rate) if rate > 0 else batch
    while perf() < deadline:
        await produce_pipeline(chunk)
        counts["sent"] += chunk
        if rate > 0:
            delay = start + counts["sent"] / rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
    produced_s = perf() - start
    done_producing.set()
    last = await asyncio.wait_for(consumer, 60)
    result.sent, result.delivered = counts["sent"], counts["delivered"]
    result.seconds = round(produced_s, 3)
    result.publish_rate = round(counts["acked"] / produced_s, 1)
    result.end_to_end_rate = round(counts["delivered"] / (last - start), 1)
    result.deliver_latency_ms = percentiles(deliver_lat)
    await producer_conn.aclose()
    await consumer_conn.aclose()
    return result
