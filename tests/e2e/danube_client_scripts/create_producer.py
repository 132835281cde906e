"""Try to create a producer with the real danube-client; prints one JSON result as its last line.

usage: create_producer.py URL TOPIC [--name NAME] [--reliable] [--name-file PATH] [--topic-file PATH]

Result: {"error": null} once created, else {"error": "CODE: details", "details_bytes": N}.
--name-file / --topic-file read the name from a file (for names too large for a command line).
"""

import argparse
import asyncio
import json

import grpc

from danube import DanubeClientBuilder, DispatchStrategy
from danube.errors import DanubeError


def rpc_error(exc):
    seen = exc
    while seen is not None:
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def main(a) -> dict:
    topic = open(a.topic_file, encoding="utf-8").read() if a.topic_file else a.topic
    name = open(a.name_file, encoding="utf-8").read() if a.name_file else a.name
    client = await DanubeClientBuilder().service_url(a.url).build()
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE if a.reliable else DispatchStrategy.NON_RELIABLE)
        .build()
    )
    try:
        await producer.create()
    except (grpc.aio.AioRpcError, DanubeError, ValueError) as exc:
        cause = rpc_error(exc)
        if cause is None:
            return {"error": f"{type(exc).__name__}: {exc}", "details_bytes": len(str(exc).encode())}
        details = cause.details() or ""
        return {"error": f"{cause.code().name}: {details}", "details_bytes": len(details.encode())}
    return {"error": None}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--name", default="producer-1")
    p.add_argument("--reliable", action="store_true")
    p.add_argument("--name-file", default="")
    p.add_argument("--topic-file", default="")
    print(json.dumps(asyncio.run(main(p.parse_args()))))
