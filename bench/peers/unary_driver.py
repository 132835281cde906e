"""One driver for both sides of the unary comparison, run in the `danube-client` 0.5.0 venv.

    python unary_driver.py raw 127.0.0.1:PORT --concurrency 64 --duration 3
    python unary_driver.py danube http://127.0.0.1:PORT --concurrency 64 --duration 3

``raw``: one unary call per message to the bare grpc.aio echo server's ``/bench.Echo/Echo``
(``grpc_echo.py``: identity serializers, the payload comes back).  ``danube``: the REAL
``danube-client`` 0.5.0 producer, ``await producer.send(payload)`` per message (one unary
``SendMessage`` each) on a reliable topic; pointed at the broker the call is answered once the
message is durable, pointed at ``grpc_echo.py`` it is answered at once.  All run the same worker loop:
``--concurrency`` tasks, each awaiting one call after another, on the same event loop type and
grpcio, so the two rates compare the per-call cost of the two servers plus the client library.
The first ``--warmup`` seconds are not counted.  Prints one JSON object on its last line.

This file runs in the client venv, where ``danube`` is the client package, never this repo's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def drive(call, payload: bytes, *, concurrency: int, duration: float, warmup: float) -> dict:
    perf = time.perf_counter
    start = perf()
    measure_from = start + warmup
    deadline = measure_from + duration
    counted = [0]
    latencies: list[float] = []

    async def worker() -> None:
        while True:
            t0 = perf()
            if t0 >= deadline:
                return
            await call(payload)
            t1 = perf()
            if t0 >= measure_from:
                counted[0] += 1
                latencies.append(t1 - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = max(perf() - measure_from, 1e-9)
    latencies.sort()
    n = len(latencies)

    def at(q: float) -> float:
        return round(latencies[min(n - 1, int(q * n))] * 1000, 3) if n else float("nan")

    return {
        "calls": counted[0],
        "seconds": round(seconds, 3),
        "rate": round(counted[0] / seconds, 1),
        "call_latency_ms": {"p50": at(0.5), "p99": at(0.99)},
    }


async def run_raw(address: str, a) -> dict:
    import grpc

    channel = grpc.aio.insecure_channel(address)
    call = channel.unary_unary("/bench.Echo/Echo")  # no serializers: bytes in, bytes out
    try:
        return await drive(
            call, b"\x00" * a.message_size, concurrency=a.concurrency, duration=a.duration, warmup=a.warmup
        )
    finally:
        await channel.close()


async def run_danube(url: str, a) -> dict:
    from danube import DanubeClientBuilder, DispatchStrategy

    client = await DanubeClientBuilder().service_url(url).build()
    producer = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name("unary-driver")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    try:
        return await drive(
            producer.send, b"\x00" * a.message_size, concurrency=a.concurrency, duration=a.duration, warmup=a.warmup
        )
    finally:
        await producer.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", choices=["raw", "danube"])
    p.add_argument("address", help="raw: HOST:PORT; danube: service URL")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--message-size", type=int, default=100)
    p.add_argument("--topic", default="/default/unary-bench")
    a = p.parse_args()
    runner = run_raw if a.target == "raw" else run_danube
    print(json.dumps(asyncio.run(runner(a.address, a))))


if __name__ == "__main__":
    main()
