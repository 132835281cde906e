"""Produce keyed messages with attributes with the real danube-client, ``--window`` sends in flight.

Message i: payload ``PREFIX-i`` (zero-padded), routing key ``k<i % 7>``, attributes ``{"i": i, "kind":
even|odd}``.  Prints one JSON line per ``--report-every`` acks (``{"acked": n, "t": unix time}``) and
``{"sent": n}`` last.  With a window above 1 the broker may store them in another order.

usage: produce_window.py URL TOPIC --count N [--window W] [--start I] [--prefix P]
"""

import argparse
import asyncio
import json
import time

import grpc

from danube import DanubeClientBuilder, DispatchStrategy


def message(prefix: str, i: int):
    return f"{prefix}-{i:08d}".encode(), f"k{i % 7}", {"i": str(i), "kind": "even" if i % 2 == 0 else "odd"}


async def main(a) -> None:
    client = await DanubeClientBuilder().service_url(a.url).build()
    producer = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name(a.name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    acked = 0
    queue = iter(range(a.start, a.start + a.count))

    async def worker():
        nonlocal acked
        for i in queue:
            payload, key, attrs = message(a.prefix, i)
            for attempt in range(60):
                try:
                    await producer.send_with_key(payload, attrs, key)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in (grpc.StatusCode.UNAVAILABLE,) or attempt == 59:
                        raise
                    await asyncio.sleep(0.25)
            acked += 1
            if a.report_every and acked % a.report_every == 0:
                print(json.dumps({"acked": acked, "t": time.time()}), flush=True)

    await asyncio.gather(*(worker() for _ in range(a.window)))
    await producer.close()
    print(json.dumps({"sent": acked}), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--window", type=int, default=1)
    p.add_argument("--name", default="producer-w")
    p.add_argument("--prefix", default="m")
    p.add_argument("--report-every", type=int, default=0)
    asyncio.run(main(p.parse_args()))
