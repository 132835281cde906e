"""Produce with the real danube-client while the topic moves, the application doing nothing about it:
one producer, built once, and a plain ``send`` loop.  danube-client 0.5.0 follows the move by itself: the
old owner answers a send for the moved producer UNAVAILABLE, the client retries that (linear backoff,
5 tries), then looks the topic up again and re-creates its producer at the new owner (the message is
sent there; docs/cluster.md "Client behaviour").  Any error out of ``send`` ends the script (exit 1,
the error on stdout).  Prints {"sent": [...], "error": null}.

usage: move_produce.py URL TOPIC --count N [--prefix P] [--delay-ms MS]
"""

import argparse
import asyncio
import json
import sys

import grpc

from danube import DanubeClientBuilder, DispatchStrategy


async def main(a) -> int:
    client = await DanubeClientBuilder().service_url(a.url).build()
    producer = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name("dp")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    for attempt in range(200):  # the topic may be moving when the script starts
        try:
            await producer.create()
            break
        except grpc.aio.AioRpcError:
            if attempt == 199:
                raise
            await asyncio.sleep(0.1)
    sent = []
    error = None
    for i in range(a.count):
        payload = f"{a.prefix}-{i}"
        try:
            await producer.send(payload.encode(), {"i": str(i)})
        except Exception as exc:  # noqa: BLE001 - reported: the application was left to handle it
            error = f"send of {payload} raised {type(exc).__name__}: {exc}"
            break
        sent.append(payload)
        await asyncio.sleep(a.delay_ms / 1000)
    await producer.close()
    print(json.dumps({"sent": sent, "error": error}))
    return 1 if error else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--prefix", default="d")
    p.add_argument("--delay-ms", type=int, default=0)
    sys.exit(asyncio.run(main(p.parse_args())))
