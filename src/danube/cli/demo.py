"""`danube demo`: start a broker, produce and consume end to end, stop it cleanly.

The broker runs as a subprocess (`danube broker`) on free loopback ports with a
temporary data directory. The demo first speaks Danube's own protocol to it,
one unary call per message as Danube's clients do, then sends a larger volume
on the batch lane with `danube.client`, and checks every message came back
once and in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time

from danube.cli._process import spawned_broker

log = logging.getLogger("danube.demo")


def _report(result: dict, how: str) -> None:
    rate = result["sent"] / result["total_s"] if result["total_s"] else 0.0
    complete = result["received"] == result["sent"] and result["in_order"]
    print(
        f"sent {result['sent']}, received and acked {result['received']} "
        f"({'all present, in order' if complete else 'MISSING OR OUT-OF-ORDER MESSAGES'}) "
        f"in {result['total_s']:.2f} s ({rate:,.0f} msg/s end to end, {how})"
    )


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="start a broker, produce and consume messages end to end, stop it",
        description="Start a standalone broker on free loopback ports with a temporary data directory, "
        "produce N messages to a reliable topic with Danube's protocol, consume and ack them, "
        "print a summary and stop the broker cleanly (exit 0 on success).",
    )
    p.add_argument("--messages", "-n", type=int, default=1000, help="messages to send [default 1000]")
    p.add_argument("--size", type=int, default=100, help="payload bytes [default 100]")
    p.add_argument("--topic", default="/default/demo", help="topic [default /default/demo]")
    p.add_argument("--in-flight", type=int, default=64, help="concurrent SendMessage calls [default 64]")
    p.add_argument(
        "--batch-messages",
        type=int,
        default=200_000,
        help="messages for the second phase, on the batch lane with danube.client [default 200000; 0 = skip]",
    )
    p.set_defaults(func=run)


async def _exercise(target: str, topic: str, count: int, size: int, in_flight: int) -> dict:
    import grpc

    from danube.proto.danube import DanubeApi_pb2 as pb
    from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(target) as channel:
        producers = pb_grpc.ProducerServiceStub(channel)
        consumers = pb_grpc.ConsumerServiceStub(channel)
        created = await producers.CreateProducer(
            pb.ProducerRequest(
                request_id=1, producer_name="demo-producer", topic_name=topic, dispatch_strategy=pb.Reliable
            )
        )
        sub = await consumers.Subscribe(
            pb.ConsumerRequest(
                request_id=2,
                topic_name=topic,
                consumer_name="demo-consumer",
                subscription="demo",
                subscription_type=pb.ConsumerRequest.Exclusive,
            )
        )
        stream = consumers.ReceiveMessages(pb.ReceiveRequest(request_id=3, consumer_id=sub.consumer_id))

        pad = b"x" * max(0, size - 12)
        started = time.perf_counter()
        semaphore = asyncio.Semaphore(in_flight)

        async def send(i: int) -> None:
            async with semaphore:
                await producers.SendMessage(
                    pb.StreamMessage(
                        request_id=i,
                        msg_id=pb.MsgID(producer_id=created.producer_id, topic_name=topic),
                        payload=b"%012d" % i + pad,
                        publish_time=int(time.time() * 1000),
                        producer_name="demo-producer",
                    )
                )

        async def consume() -> list[int]:
            got = []
            acks = []
            async for msg in stream:
                got.append(int(msg.payload[:12]))
                acks.append(
                    asyncio.ensure_future(
                        consumers.Ack(
                            pb.AckRequest(request_id=msg.request_id, msg_id=msg.msg_id, subscription_name="demo")
                        )
                    )
                )
                if len(got) == count:
                    break
            await asyncio.gather(*acks)
            return got

        consumer = asyncio.create_task(consume())
        await asyncio.gather(*(send(i) for i in range(count)))
        produced = time.perf_counter() - started
        got = await asyncio.wait_for(consumer, 120)
        total = time.perf_counter() - started
        stream.cancel()
    return {
        "sent": count,
        "received": len(got),
        "in_order": sorted(got) == list(range(count)),
        "produce_s": produced,
        "total_s": total,
    }


async def _exercise_batch_lane(service_url: str, topic: str, count: int, size: int) -> dict:
    """Second phase: the same round trip on the batch lane with the project's own client."""
    from danube.client import DanubeClient, SubType

    client = DanubeClient.builder().service_url(service_url).build()
    try:
        consumer = (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name("demo-batch-consumer")
            .with_subscription("demo-batch")
            .with_subscription_type(SubType.Exclusive)
            .with_reliable()
            .build()
        )  # subscribed before the producer exists: creates the topic
        await consumer.subscribe()
        producer = client.new_producer().with_topic(topic).with_name("demo-batch-producer").build()
        await producer.create()
        payloads = [b"%012d" % i + b"x" * max(0, size - 12) for i in range(count)]
        started = time.perf_counter()

        async def consume() -> int:
            received = 0
            next_expected = 0
            in_order = True
            async for batch in consumer.batches():
                for payload in batch.payloads():
                    in_order &= int(bytes(payload[:12])) == next_expected
                    next_expected += 1
                received += batch.count
                await consumer.ack_batch(batch)
                if received >= count:
                    return received if in_order else -received
            return received

        receiving = asyncio.create_task(consume())
        chunk = 10_000
        for i in range(0, count, chunk):
            await producer.send_batch(payloads[i : i + chunk])
        await producer.flush()
        produced = time.perf_counter() - started
        received = await asyncio.wait_for(receiving, 120)
        total = time.perf_counter() - started
        await producer.close()
        await consumer.close()
    finally:
        await client.close()
    return {"sent": count, "received": abs(received), "in_order": received > 0, "produce_s": produced, "total_s": total}


def run(args) -> int:
    data_dir = tempfile.mkdtemp(prefix="danube-demo-")
    log_path = os.path.join(data_dir, "broker.log")
    result = {"sent": 0, "received": -1, "in_order": False}
    try:
        with spawned_broker("always", data_dir, log_path=log_path) as broker:
            print(f"starting broker on 127.0.0.1:{broker.port} (data {data_dir}, log {log_path})")
            print(
                f"producing {args.messages} messages of {args.size} bytes to {args.topic} (reliable) "
                f"and consuming them with an exclusive subscription"
            )
            result = asyncio.run(
                _exercise(f"127.0.0.1:{broker.port}", args.topic, args.messages, args.size, args.in_flight)
            )
            _report(result, "one unary call per message (Danube's protocol)")
            if args.batch_messages > 0:
                print(
                    f"producing {args.batch_messages} messages of {args.size} bytes to {args.topic}-batch "
                    f"on the batch lane (danube.client) and consuming them"
                )
                batch = asyncio.run(
                    _exercise_batch_lane(broker.service_url, f"{args.topic}-batch", args.batch_messages, args.size)
                )
                _report(batch, "batches on the batch lane")
                result["received"] = result["received"] if batch["received"] == batch["sent"] else -1
                result["in_order"] = result["in_order"] and batch["in_order"]
            proc = broker.proc
    except Exception as exc:  # noqa: BLE001 - report; the broker is stopped by the context manager
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    ok = result["received"] == result["sent"] and result["in_order"] and proc.returncode == 0
    print(f"broker stopped with exit code {proc.returncode}")
    if ok:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if ok else 1
