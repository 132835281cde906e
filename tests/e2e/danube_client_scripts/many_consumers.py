"""Many consumers and producers in one real danube-client; prints one JSON result as its last line.

usage: many_consumers.py URL PREFIX --topics T --subscriptions S [--messages M] [--seconds SEC]

One client (the library keeps one gRPC channel, so one HTTP/2 connection, per broker) creates a
producer per topic, subscribes S exclusive consumers (subscriptions s0..) to each of T topics,
starts every consumer's receive stream, then each producer sends M messages; each is acked.  It waits up to
--seconds for every consumer to get its topic's M messages, and never longer, so a client whose
calls the transport holds back still reports.

Result: {"subscribed": n, "producers": n, "sent": n, "received": {"topic|sub": [payloads]},
         "complete": consumers with all M, "connections": TCP connections to the broker's port,
         "error": null | "where: what"}
"""

import argparse
import asyncio
import json
import os
import time

from danube import DanubeClientBuilder, DispatchStrategy, SubType


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            remote_port = int(cols[2].rsplit(":", 1)[1], 16)
            if remote_port == port and cols[3] == "01" and cols[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


async def main(a) -> dict:
    deadline = time.monotonic() + a.seconds
    result = {"subscribed": 0, "producers": 0, "sent": 0, "received": {}, "complete": 0, "connections": 0}
    result["error"] = None
    client = await DanubeClientBuilder().service_url(a.url).build()
    topics = [f"{a.prefix}-{t}" for t in range(a.topics)]
    subs = [f"s{s}" for s in range(a.subscriptions)]

    async def within(what, aws):
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.gather(*aws), max(left, 0.1))
        except asyncio.TimeoutError:
            result["error"] = f"{what}: not done within {a.seconds}s"
            return None

    producers = [
        client.new_producer().with_topic(t).with_name("p").with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
        for t in topics
    ]

    async def create(p):
        await p.create()
        result["producers"] += 1

    consumers = {
        (t, s): client.new_consumer()
        .with_topic(t)
        .with_consumer_name(f"c-{s}")
        .with_subscription(s)
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
        for t in topics
        for s in subs
    }

    async def subscribe(c):
        await c.subscribe()
        result["subscribed"] += 1

    async def consume(key, consumer):
        got = result["received"].setdefault("|".join(key), [])
        queue = await consumer.receive()
        while len(got) < a.messages:
            message = await queue.get()
            got.append(message.payload.decode())
            await consumer.ack(message)
        result["complete"] += 1

    async def send(t, p):
        for i in range(a.messages):
            await p.send(f"{t}:{i}".encode(), {})
            result["sent"] += 1

    readers = []
    try:
        if await within("creating producers", [create(p) for p in producers]) is None:
            return result
        if await within("subscribing", [subscribe(c) for c in consumers.values()]) is None:
            return result
        # Reliable topics: a subscription gets what was sent after it, whenever its stream opens.
        readers = [asyncio.ensure_future(consume(k, c)) for k, c in consumers.items()]
        if await within("sending", [send(t, p) for t, p in zip(topics, producers)]) is None:
            return result
        await within("receiving", readers)
        return result
    finally:
        result["connections"] = connections_to(int(a.url.rsplit(":", 1)[1]))
        for r in readers:
            r.cancel()
        # close() sleeps a grace period per consumer: closed together, not one after the other.
        await asyncio.gather(*(c.close() for c in consumers.values()), return_exceptions=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("--topics", type=int, required=True)
    p.add_argument("--subscriptions", type=int, default=1)
    p.add_argument("--messages", type=int, default=2)
    p.add_argument("--seconds", type=float, default=60.0)
    print(json.dumps(asyncio.run(main(p.parse_args()))))
