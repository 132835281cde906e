"""Consume with the real danube-client; prints one JSON result as its last line.

usage: consume.py URL TOPIC SUBSCRIPTION --type exclusive|shared|failover|key_shared
                  [--name C] [--count N] [--idle-timeout S] [--ack-first K]
                  [--filters a*,b?] [--nack-delay-ms MS] [--ready-file PATH] [--distinct] [--seconds S]

Result: {"received": [[payload, topic, offset, key], ...], "acked": [...payloads],
         "nacked": [...], "times": {payload: [arrival time, ...]},
         "ack_times": {payload: first ack completion time}, "error": null | "CODE: message"}
It stops after --count messages (0 = until idle; with --distinct, --count different
payloads, so redeliveries do not count), or after --idle-timeout seconds without a message, or
--seconds after it subscribed.  --ack-first K acks only the first K messages.
--nack-delay-ms nacks each message the first time it arrives, acks it the second time.
Arrival times are taken as the client library hands messages over, not when this loop gets to
them: while an ack is retried across a broker restart, a redelivery can already be waiting.
"""

import argparse
import asyncio
import json
import time

import grpc

from danube import DanubeClientBuilder, SubType
from danube.errors import DanubeError

TYPES = {
    "exclusive": SubType.EXCLUSIVE,
    "shared": SubType.SHARED,
    "failover": SubType.FAILOVER,
    "key_shared": SubType.KEY_SHARED,
}


async def retry(call):
    for attempt in range(80):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or attempt == 79:
                raise
            await asyncio.sleep(0.25)


async def main(a) -> dict:
    result = {"received": [], "acked": [], "nacked": [], "times": {}, "ack_times": {}, "error": None}
    client = await DanubeClientBuilder().service_url(a.url).build()
    builder = (
        client.new_consumer()
        .with_topic(a.topic)
        .with_consumer_name(a.name)
        .with_subscription(a.subscription)
        .with_subscription_type(TYPES[a.type])
    )
    if a.filters:
        builder = builder.with_key_filters(a.filters.split(","))
    consumer = builder.build()
    try:
        await consumer.subscribe()
    except (grpc.aio.AioRpcError, DanubeError) as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, grpc.aio.AioRpcError) else exc
        code = cause.code().name if isinstance(cause, grpc.aio.AioRpcError) else type(exc).__name__
        details = cause.details() if isinstance(cause, grpc.aio.AioRpcError) else str(exc)
        result["error"] = f"{code}: {details}"
        return result
    delivered = await consumer.receive()
    queue: asyncio.Queue = asyncio.Queue()

    async def stamp_arrivals():
        while True:
            message = await delivered.get()
            queue.put_nowait((message, time.monotonic()))

    stamper = asyncio.ensure_future(stamp_arrivals())
    if a.ready_file:
        open(a.ready_file, "w").close()
    nacked = set()
    stop_at = time.monotonic() + a.seconds if a.seconds else None
    try:
        while a.count == 0 or (len(result["times"]) if a.distinct else len(result["received"])) < a.count:
            wait = a.idle_timeout if stop_at is None else min(a.idle_timeout, stop_at - time.monotonic())
            try:
                if wait <= 0:
                    break
                msg, arrived = await asyncio.wait_for(queue.get(), wait)
            except asyncio.TimeoutError:
                break
            payload = msg.payload.decode()
            key = msg.routing_key if msg.HasField("routing_key") else None
            result["received"].append([payload, msg.msg_id.topic_name, msg.msg_id.topic_offset, key])
            result["times"].setdefault(payload, []).append(arrived)
            if a.nack_delay_ms is not None and payload not in nacked:
                nacked.add(payload)
                await retry(lambda: consumer.nack(msg, a.nack_delay_ms, "testing nack"))
                result["nacked"].append(payload)
                continue
            if a.ack_first is None or len(result["acked"]) < a.ack_first:
                await retry(lambda: consumer.ack(msg))
                result["acked"].append(payload)
                result["ack_times"].setdefault(payload, time.monotonic())
    finally:
        stamper.cancel()
        await consumer.close()
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument("--type", default="exclusive", choices=sorted(TYPES))
    p.add_argument("--name", default="consumer-1")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--idle-timeout", type=float, default=5.0)
    p.add_argument("--ack-first", type=int, default=None)
    p.add_argument("--filters", default="")
    p.add_argument("--nack-delay-ms", type=int, default=None)
    p.add_argument("--ready-file", default="")
    p.add_argument("--distinct", action="store_true")
    p.add_argument("--seconds", type=float, default=0.0)
    print(json.dumps(asyncio.run(main(p.parse_args()))))
