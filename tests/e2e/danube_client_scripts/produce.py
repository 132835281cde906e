"""Produce with the real danube-client: prints {"sent": [...payloads]} as its last line.

usage: produce.py URL TOPIC --count N [--reliable] [--partitions P] [--name NAME]
                  [--prefix P] [--keys k1,k2] [--start I]
"""

import argparse
import asyncio
import json

import grpc

from danube import DanubeClientBuilder, DispatchStrategy


async def main(a) -> None:
    client = await DanubeClientBuilder().service_url(a.url).build()
    builder = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name(a.name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE if a.reliable else DispatchStrategy.NON_RELIABLE)
    )
    if a.partitions:
        builder = builder.with_partitions(a.partitions)
    producer = builder.build()
    await producer.create()
    keys = a.keys.split(",") if a.keys else []
    sent = []
    for i in range(a.start, a.start + a.count):
        payload = f"{a.prefix}-{i}"
        key = keys[i % len(keys)] if keys else None
        for attempt in range(60):
            try:
                if key is None:
                    await producer.send(payload.encode(), {"i": str(i)})
                else:
                    await producer.send_with_key(payload.encode(), {"i": str(i)}, key)
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or attempt == 59:
                    raise
                await asyncio.sleep(0.25)  # the broker is restarting
        sent.append(payload if key is None else f"{payload}@{key}")
        if a.delay_ms:
            await asyncio.sleep(a.delay_ms / 1000)
    await producer.close()
    print(json.dumps({"sent": sent}))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--reliable", action="store_true")
    p.add_argument("--partitions", type=int, default=0)
    p.add_argument("--name", default="producer-1")
    p.add_argument("--prefix", default="m")
    p.add_argument("--keys", default="")
    p.add_argument("--delay-ms", type=int, default=0)
    asyncio.run(main(p.parse_args()))
