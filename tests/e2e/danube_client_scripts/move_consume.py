"""Consume with the real danube-client while the topic moves; acks are NOT retried (an ack
must never fail because of a move).  Prints one JSON result as its last line.

usage: move_consume.py URL TOPIC SUBSCRIPTION --idle-timeout S [--ready-file PATH]

Result: {"received": [[offset, payload], ...], "ack_errors": ["CODE: details", ...], "error": null}
It stops after --idle-timeout seconds without a message.
"""

import argparse
import asyncio
import json
import logging

import grpc

from danube import DanubeClientBuilder, SubType


async def main(a) -> dict:
    result = {"received": [], "ack_errors": [], "error": None}
    client = await DanubeClientBuilder().service_url(a.url).build()
    consumer = (
        client.new_consumer()
        .with_topic(a.topic)
        .with_consumer_name("dc")
        .with_subscription(a.subscription)
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    delivered = await consumer.receive()
    if a.ready_file:
        open(a.ready_file, "w").close()
    try:
        while True:
            try:
                msg = await asyncio.wait_for(delivered.get(), a.idle_timeout)
            except asyncio.TimeoutError:
                break
            result["received"].append([msg.msg_id.topic_offset, msg.payload.decode()])
            try:
                await consumer.ack(msg)
            except grpc.aio.AioRpcError as exc:
                result["ack_errors"].append(f"{exc.code().name}: {exc.details()}")
            except Exception as exc:  # noqa: BLE001
                result["ack_errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        await consumer.close()
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument("--idle-timeout", type=float, default=8.0)
    p.add_argument("--ready-file", default="")
    print(json.dumps(asyncio.run(main(p.parse_args()))))
