"""A danube-client 0.5.0 application with default options under broker faults: one Reliable producer
sending ``p-<i>`` one at a time, one Exclusive consumer acking everything it gets, neither rebuilt.
Nothing here handles a fault: any exception out of ``send`` or ``ack``, or a receive loop of the
client that ends, is recorded as what reached the application.

It creates the consumer, then the producer, touches --ready-file, and sends until --stop-file
exists; then it waits until every acked message was received (or --drain-timeout s) and prints one
JSON line: {"acked": [[i, t_start, t_end], ...], "received": [[offset, payload, t], ...],
"consumer_acks": [[offset, t_answered_ok], ...], "errors": [...], "ack_errors": [...],
"loop_errors": [...]} (times: time.time()).  While --hold-file exists the application takes
nothing from the consumer (so acks nothing).

usage: fault_load.py URL TOPIC --ready-file P --stop-file P [--delay-ms MS] [--drain-timeout S]
                     [--hold-file P]
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import time

from danube import DanubeClientBuilder, DispatchStrategy, SubType


class _Errors(logging.Handler):
    """The client's own ERROR records (a receive loop that gave up logs one and ends)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record) -> None:
        self.records.append(record.getMessage())


async def main(a) -> dict:
    errors_log = _Errors()
    logging.getLogger("danube").addHandler(errors_log)
    out = {
        "acked": [],
        "received": [],
        "consumer_acks": [],
        "errors": [],
        "ack_errors": [],
        "loop_errors": errors_log.records,
    }
    client = await DanubeClientBuilder().service_url(a.url).build()
    consumer = (
        client.new_consumer()
        .with_topic(a.topic)
        .with_consumer_name("fc")
        .with_subscription("faults")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    producer = (
        client.new_producer()
        .with_topic(a.topic)
        .with_name("fp")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()  # creates the topic
    await consumer.subscribe()
    queue = await consumer.receive()

    async def consume():
        while True:
            while a.hold_file and os.path.exists(a.hold_file):
                await asyncio.sleep(0.02)
            msg = await queue.get()
            out["received"].append([msg.msg_id.topic_offset, msg.payload.decode(), time.time()])
            try:
                await consumer.ack(msg)
                out["consumer_acks"].append([msg.msg_id.topic_offset, time.time()])
            except Exception as exc:  # noqa: BLE001 - what reached the application
                out["ack_errors"].append(f"{type(exc).__name__}: {exc}")

    consuming = asyncio.ensure_future(consume())
    open(a.ready_file, "w").close()
    i = 0
    while not os.path.exists(a.stop_file):
        start = time.time()
        try:
            await producer.send(f"p-{i}".encode())
        except Exception as exc:  # noqa: BLE001 - what reached the application
            out["errors"].append(f"send of p-{i} raised {type(exc).__name__}: {exc}")
            break
        out["acked"].append([i, start, time.time()])
        i += 1
        await asyncio.sleep(a.delay_ms / 1000)
    wanted = {f"p-{n}" for n, _, _ in out["acked"]}
    deadline = time.monotonic() + a.drain_timeout
    while time.monotonic() < deadline and not wanted <= {r[1] for r in out["received"]}:
        await asyncio.sleep(0.1)
    for task in consumer._tasks:  # a receive loop of the client that ended by itself
        if task.done() and not task.cancelled():
            out["loop_errors"].append("a receive loop of the client ended")
    consuming.cancel()
    await producer.close()
    await consumer.close()
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("topic")
    p.add_argument("--ready-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--delay-ms", type=int, default=5)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--hold-file", default=None)
    print(json.dumps(asyncio.run(main(p.parse_args()))))
    sys.stdout.flush()
