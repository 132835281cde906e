"""Create a producer, subscribe, produce COUNT messages and receive them with the real danube-client over TLS/mTLS/JWT.

usage: secure_roundtrip.py URL TOPIC [--count N] [--ca PEM] [--cert PEM --key PEM] [--token JWT]
                           [--token-file PATH] [--delay-ms MS] [--produce-only]

--token-file: a token supplier that reads PATH on every call (the test rewrites it).
Last stdout line: {"sent": [...], "received": [...], "error": null | "CODE: details"}.
"""

import argparse
import asyncio
import json

import grpc

from danube import DanubeClientBuilder, DispatchStrategy, SubType


def error_of(exc) -> str:
    cause = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
    if isinstance(cause, grpc.aio.AioRpcError):
        return f"{cause.code().name}: {cause.details()}"
    return f"{type(exc).__name__}: {exc}"


async def main(a) -> dict:
    result = {"sent": [], "received": [], "error": None}
    builder = DanubeClientBuilder().service_url(a.url)
    if a.cert:
        builder = builder.with_mtls(a.ca, a.cert, a.key)
    elif a.ca:
        builder = builder.with_tls(a.ca)
    if a.token:
        builder = builder.with_token(a.token)
    if a.token_file:
        path = a.token_file

        def supplier() -> str:
            with open(path) as f:
                return f.read().strip()

        builder = builder.with_token_supplier(supplier)
    client = await builder.build()
    try:
        producer = (
            client.new_producer()
            .with_topic(a.topic)
            .with_name("p1")
            .with_dispatch_strategy(DispatchStrategy.RELIABLE)
            .build()
        )
        await asyncio.wait_for(producer.create(), 30)
        consumer = None
        if not a.produce_only:
            consumer = (
                client.new_consumer()
                .with_topic(a.topic)
                .with_consumer_name("c1")
                .with_subscription("s1")
                .with_subscription_type(SubType.EXCLUSIVE)
                .build()
            )
            await asyncio.wait_for(consumer.subscribe(), 30)
        for i in range(a.count):
            payload = f"m-{i}"
            await asyncio.wait_for(producer.send(payload.encode(), {}), 30)
            result["sent"].append(payload)
            if a.delay_ms:
                await asyncio.sleep(a.delay_ms / 1000)
        if consumer is not None:
            queue = await consumer.receive()
            while len(result["received"]) < a.count:
                message = await asyncio.wait_for(queue.get(), 20)
                result["received"].append(message.payload.decode())
                await consumer.ack(message)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = error_of(exc)
    return result


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--count", type=int, default=5)
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--token")
    p.add_argument("--token-file")
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--produce-only", action="store_true")
    args = p.parse_args()
    print(json.dumps(asyncio.run(main(args))), flush=True)
    import os

    os._exit(0)  # do not wait for the client's background tasks
