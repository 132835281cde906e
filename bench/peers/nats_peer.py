"""NATS JetStream (Debian nats-server, file storage) driven by nats-py with batching.

Producer: ``publish_async`` with a window of pending acks.  Consumer: a pull
consumer fetching up to ``batch`` messages per request, acking the last of each
fetch (AckPolicy.ALL acknowledges everything up to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time

from bench.peers.common import PeerResult, free_port, paced_chunk, payload, percentiles, sent_at, server_process

STREAM, SUBJECT = "BENCH", "bench.events"


# What the server does about fsync: nats-server 2.9 (Debian bookworm's) has no setting for it and
# syncs its file store on its own timer; ``jetstream { sync_interval: always }`` (fsync before each
# ack, danube's sync=always) arrived in 2.10.  Each sync mode therefore runs the same server.
SYNC_NOTE = "file storage, no per-write fsync (nats-server 2.9 has no sync_interval setting)"


@contextlib.contextmanager
def nats_server_process():
    """(url, server pid) of a JetStream server with file storage in a temporary directory."""
    port = free_port()
    store = tempfile.mkdtemp(prefix="nats-bench-")
    try:
        with server_process(["nats-server", "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store], port) as proc:
            yield f"nats://127.0.0.1:{port}", proc.pid
    finally:
        shutil.rmtree(store, ignore_errors=True)


@contextlib.contextmanager
def nats_server():
    with nats_server_process() as (url, _pid):
        yield url


async def run(
    url: str, *, message_size: int, duration: float, rate: float = 0.0, batch: int = 1000, window: int = 4000
) -> PeerResult:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=window)
    with contextlib.suppress(Exception):
        await js.delete_stream(STREAM)
    await js.add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE)
    sub = await js.pull_subscribe(
        SUBJECT, durable="bench", config=ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
    )
    result = PeerResult("nats-jetstream", "max" if rate <= 0 else f"rate={rate:.0f}")
    deliver_lat: list[float] = []
    counts = {"sent": 0, "acked": 0, "delivered": 0}
    done_producing = asyncio.Event()
    perf = time.perf_counter

    async def consume():
        last = perf()
        while True:
            try:
                msgs = await sub.fetch(batch=batch, timeout=0.5)
            except Exception:  # nats.errors.TimeoutError: nothing right now
                if done_producing.is_set() and counts["delivered"] >= counts["acked"]:
                    return last
                continue
            now = last = perf()
            deliver_lat.extend([now - sent_at(m.data) for m in msgs])  # every message sampled
            counts["delivered"] += len(msgs)
            await msgs[-1].ack()

    consumer = asyncio.ensure_future(consume())
    start = perf()
    deadline = start + duration
    chunk = paced_chunk(rate) if rate > 0 else batch

    def acked(_f):
        counts["acked"] += 1

    while perf() < deadline:
        data = payload(message_size, perf())
        for _ in range(chunk):
            fut = await js.publish_async(SUBJECT, data)
            fut.add_done_callback(acked)
        counts["sent"] += chunk
        if rate > 0:
            delay = start + counts["sent"] / rate - perf()
            if delay > 0:
                await asyncio.sleep(delay)
    await js.publish_async_completed()
    produced_s = perf() - start
    done_producing.set()
    last = await asyncio.wait_for(consumer, 60)
    result.sent, result.delivered = counts["sent"], counts["delivered"]
    result.seconds = round(produced_s, 3)
    result.publish_rate = round(counts["acked"] / produced_s, 1)
    result.end_to_end_rate = round(counts["delivered"] / (last - start), 1)
    result.deliver_latency_ms = percentiles(deliver_lat)
    await nc.close()
    return result
