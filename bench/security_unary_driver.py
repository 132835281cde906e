"""Unary SendMessage calls/s with the REAL danube-client 0.5.0, plain or with TLS + a JWT.

    python security_unary_driver.py http://127.0.0.1:PORT [--ca PEM --token JWT] --concurrency 64 --duration 3

Runs in the client venv (``danube`` is the client package there).  ``--concurrency`` tasks
each await one ``producer.send`` after another (one unary ``SendMessage`` per message, with
``authorization: Bearer`` metadata when a token is given); the first ``--warmup`` seconds are
not counted.  Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def main(a) -> dict:
    from danube import DanubeClientBuilder, DispatchStrategy

    builder = DanubeClientBuilder().service_url(a.url)
    if a.ca:
        builder = builder.with_tls(a.ca)
    if a.token:
        builder = builder.with_token(a.token)
    client = await builder.build()
    producer = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name("security-bench")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    payload = b"\x00" * a.message_size
    perf = time.perf_counter
    measure_from = perf() + a.warmup
    deadline = measure_from + a.duration
    counted = [0]

    async def worker() -> None:
        while True:
            t0 = perf()
            if t0 >= deadline:
                return
            await producer.send(payload, {})
            if t0 >= measure_from:
                counted[0] += 1

    await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    seconds = max(perf() - measure_from, 1e-9)
    return {"calls": counted[0], "seconds": round(seconds, 3), "rate": round(counted[0] / seconds, 1)}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--ca")
    p.add_argument("--token")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--message-size", type=int, default=100)
    p.add_argument("--topic", default="/default/security-unary")
    print(json.dumps(asyncio.run(main(p.parse_args()))), flush=True)
    import os

    os._exit(0)
