"""`danube produce`: publish COUNT messages of SIZE bytes through the batch lane."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from danube.cli._client_common import (
    EXIT_OK,
    add_connection_options,
    non_negative_float,
    positive_int,
    run_async,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="publish messages to a topic",
        description="Publish messages through the batch lane with danube's batching producer. "
        "Each message is SIZE bytes (or --message text). Exit 0 once every message is "
        "acknowledged as stored, 1 on an error.",
    )
    add_connection_options(parser)
    parser.add_argument("--count", "-n", type=positive_int, default=1000, help="messages to send (default 1000)")
    parser.add_argument("--size", "-s", type=positive_int, default=100, help="payload bytes (default 100)")
    parser.add_argument("--message", "-m", default=None, help="send this text as every payload instead of --size bytes")
    parser.add_argument(
        "--rate", type=non_negative_float, default=0.0, help="messages per second, 0 = as fast as possible (default 0)"
    )
    parser.add_argument("--key", default=None, help="routing key for every message")
    parser.add_argument("--producer-name", default=None, help="producer name (default danube-produce-<pid>)")
    parser.add_argument(
        "--partitions", type=positive_int, default=None, help="produce to the partitioned topic TOPIC-part-0..N-1"
    )
    parser.add_argument("--linger-ms", type=non_negative_float, default=5.0, help="batch linger (default 5 ms)")
    parser.add_argument(
        "--max-batch-bytes", type=positive_int, default=256 * 1024, help="seal a batch at this size (default 262144)"
    )
    parser.add_argument("--max-in-flight", type=positive_int, default=4, help="unacked batches (default 4)")
    parser.add_argument(
        "--schema-subject",
        default=None,
        help="publish with this schema subject's latest version (--message is then JSON, "
        "encoded with the schema for Avro; docs/schema-registry.md)",
    )
    parser.add_argument(
        "--schema-version",
        type=positive_int,
        default=None,
        help="with --schema-subject: pin this version instead of the latest",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no summary line")
    parser.set_defaults(func=run)


async def _produce(args) -> int:
    from danube.client import DanubeClient

    payload = args.message.encode() if args.message is not None else os.urandom(args.size)
    from danube.cli._client_common import with_security

    client = with_security(DanubeClient.builder().service_url(args.service_url), args).build()
    builder = (
        client.new_producer()
        .with_topic(args.topic)
        .with_name(args.producer_name or f"danube-produce-{os.getpid()}")
        .with_reliable(args.reliable)
        .with_linger_ms(args.linger_ms)
        .with_max_batch_bytes(args.max_batch_bytes)
        .with_max_in_flight(args.max_in_flight)
    )
    if args.partitions:
        builder = builder.with_partitions(args.partitions)
    if args.schema_subject:
        builder = (
            builder.with_schema_version(args.schema_subject, args.schema_version)
            if args.schema_version
            else builder.with_schema_subject(args.schema_subject)
        )
    producer = builder.build()
    try:
        await producer.create()
        if args.schema_subject:
            from danube.cli._schema_payloads import encode_message

            if args.message is None and producer.schema_info.schema_type in ("avro", "json_schema"):
                raise SystemExit(
                    f"danube produce: subject {args.schema_subject} is "
                    f"{producer.schema_info.schema_type}: give the record as --message JSON"
                )
            if args.message is not None:
                payload = encode_message(producer.schema_info, args.message)
        started = time.perf_counter()
        futures = []
        if args.rate > 0:
            # Send in slices of ~10 ms worth of messages so the rate holds without a timer per message.
            slice_n = max(1, int(args.rate / 100))
            sent = 0
            while sent < args.count:
                n = min(slice_n, args.count - sent)
                for _ in range(n):
                    futures.append(await producer.send(payload, key=args.key))
                sent += n
                delay = started + sent / args.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
        elif args.key is None and not args.partitions:
            chunk = 10_000
            for start in range(0, args.count, chunk):
                futures.append(await producer.send_batch([payload] * min(chunk, args.count - start)))
        else:
            for _ in range(args.count):
                futures.append(await producer.send(payload, key=args.key))
        await producer.flush()
        results = await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        offsets = [o for r in results for o in (r if isinstance(r, list) else [r])]
        if not args.quiet:
            rate = len(offsets) / elapsed if elapsed > 0 else float("inf")
            print(
                f"produced {len(offsets)} messages of {len(payload)} bytes to {args.topic} in {elapsed:.3f}s "
                f"({rate:,.0f} msg/s), offsets {min(offsets)}..{max(offsets)}"
            )
        return EXIT_OK
    finally:
        try:
            await producer.close()
        finally:
            await client.close()


def run(args: argparse.Namespace) -> int:
    return run_async(lambda: _produce(args))
