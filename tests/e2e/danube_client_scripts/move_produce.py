"""Produce with the real danube-client while the topic moves: danube-client 0.5.0's producer does not
re-create itself after a move (its send raises), so this loop does what its users do: build a new
producer (lookup, Redirect) and send the message again.  Prints {"sent": [...], "recreated": N}.

usage: move_produce.py URL TOPIC --count N [--prefix P] [--delay-ms MS]
"""

import argparse
import asyncio
import json

import grpc
from danube import DanubeClientBuilder, DispatchStrategy


async def main(a) -> None:
    client = await DanubeClientBuilder().service_url(a.url).build()

    async def create():
        for attempt in range(200):
            try:
                producer = (client.new_producer().with_topic(a.topic).with_name("dp")
                            .with_dispatch_strategy(DispatchStrategy.RELIABLE).build())
                await producer.create()
                return producer
            except grpc.aio.AioRpcError:
                if attempt == 199:
                    raise
                await asyncio.sleep(0.1)

    producer = await create()
    sent, recreated = [], 0
    for i in range(a.count):
        payload = f"{a.prefix}-{i}"
        for attempt in range(100):
            try:
                await producer.send(payload.encode(), {"i": str(i)})
                break
            except grpc.aio.AioRpcError:
                if attempt == 99:
                    raise
                producer = await create()
                recreated += 1
        sent.append(payload)
        await asyncio.sleep(a.delay_ms / 1000)
    print(json.dumps({"sent": sent, "recreated": recreated}))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--prefix", default="d")
    p.add_argument("--delay-ms", type=int, default=0)
    asyncio.run(main(p.parse_args()))
