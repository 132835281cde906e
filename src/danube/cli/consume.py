"""`danube consume`: receive (and ack) messages from a subscription through the batch lane."""

from __future__ import annotations

import argparse
import os
import sys
import time

from danube.cli._client_common import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    SUBSCRIPTION_TYPES,
    add_connection_options,
    non_negative_float,
    run_async,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "consume",
        help="receive messages from a topic",
        description="Subscribe through the batch lane and receive messages, acking each. Stops after "
        "--count messages (exit 0) or after --timeout seconds without a message "
        "(exit 0 when no count was asked, 3 when fewer than --count arrived); 1 on an error.",
    )
    add_connection_options(parser)
    parser.add_argument("--subscription", default="danube-cli", help="subscription name (default danube-cli)")
    parser.add_argument(
        "--subscription-type",
        "--sub-type",
        choices=SUBSCRIPTION_TYPES,
        default="exclusive",
        help="subscription type (default exclusive)",
    )
    parser.add_argument("--consumer-name", default=None, help="consumer name (default danube-consume-<pid>)")
    parser.add_argument("--count", "-n", type=int, default=0, help="stop after this many messages (0 = no limit)")
    parser.add_argument(
        "--timeout",
        type=non_negative_float,
        default=0.0,
        help="stop after this many seconds without a message (0 = wait forever)",
    )
    parser.add_argument(
        "--from",
        dest="initial_position",
        choices=["latest", "earliest"],
        default="latest",
        help="where the subscription starts if this command creates it: latest (default, as "
        "Danube: messages published from now on) or earliest (the oldest message the topic "
        "still holds); an existing subscription continues from its cursor",
    )
    parser.add_argument("--key-filter", action="append", default=[], help="key-shared glob filter (repeatable)")
    parser.add_argument(
        "--print",
        dest="print_payloads",
        action="store_true",
        help="print each payload (UTF-8, replacement for invalid bytes; messages with an "
        "Avro or JSON schema as decoded JSON)",
    )
    parser.add_argument("--no-ack", action="store_true", help="do not ack (messages will be redelivered)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no summary line")
    parser.set_defaults(func=run)


async def _consume(args) -> int:
    from danube.cli._client_common import with_security
    from danube.client import DanubeClient

    client = with_security(DanubeClient.builder().service_url(args.service_url), args).build()
    consumer = (
        client.new_consumer()
        .with_topic(args.topic)
        .with_consumer_name(args.consumer_name or f"danube-consume-{os.getpid()}")
        .with_subscription(args.subscription)
        .with_subscription_type(args.subscription_type)
        .with_key_filters(args.key_filter)
        .with_reliable(args.reliable)
        .with_initial_position(args.initial_position)
        .build()
    )
    received = 0
    nbytes = 0
    started = time.perf_counter()
    from danube.cli._schema_payloads import PayloadPrinter

    printer = PayloadPrinter(client)  # decoded JSON for messages with an Avro/JSON schema
    try:
        await consumer.subscribe()
        if not args.quiet:
            print(
                f"subscribed to {args.topic} as {args.subscription} ({args.subscription_type})",
                file=sys.stderr,
                flush=True,
            )
        while args.count <= 0 or received < args.count:
            batch = await consumer.receive_batch(timeout=args.timeout or None)
            if batch is None:
                break
            messages = batch.messages()
            if args.count > 0:
                messages = messages[: args.count - received]
            for m in messages:
                if args.print_payloads:
                    print(await printer.text(m), flush=False)
                nbytes += len(m.payload)
            received += len(messages)
            if not args.no_ack:
                if len(messages) == batch.count:
                    await consumer.ack_batch(batch)
                else:
                    await consumer.ack_many(messages)
        if args.print_payloads:
            sys.stdout.flush()
    finally:
        try:
            await consumer.close()
        finally:
            await client.close()
    elapsed = time.perf_counter() - started
    if not args.quiet:
        print(f"consumed {received} messages ({nbytes} bytes) from {args.topic} in {elapsed:.3f}s", file=sys.stderr)
    if args.count > 0 and received < args.count:
        print(f"error: only {received} of {args.count} messages arrived within the timeout", file=sys.stderr)
        return EXIT_INCOMPLETE
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    return run_async(lambda: _consume(args))
