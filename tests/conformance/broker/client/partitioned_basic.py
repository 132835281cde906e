"""danube-broker/tests/partitioned_basic.rs: a 3-partition topic, every message and every partition seen."""

import asyncio

from common import consumer, producer, recv

from danube import SubType

NAMES = {SubType.EXCLUSIVE: "cons_part_exclusive", SubType.SHARED: "cons_part_shared"}


async def _partitioned_basic(ctx, prefix, sub_type, partitions):
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, "producer_part_basic", partitions=partitions)
    name = NAMES[sub_type]
    c = await consumer(client, topic, name, f"sub_part_{name}", sub_type)
    stream = await c.receive()
    await asyncio.sleep(0.3)
    messages = ["Hello Danube 1", "Hello Danube 2", "Hello Danube 3"]
    for m in messages:
        await p.send(m.encode(), None)
    received, parts = [], set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.t(10)
    while len(received) < len(messages):
        msg = await recv(stream, max(0.1, deadline - loop.time()), f"message {len(received) + 1}")
        received.append(msg.payload.decode())
        parts.add(msg.msg_id.topic_name)
        await c.ack(msg)
    assert len(received) == len(messages), "Not all messages were received"
    for expected in messages:
        assert expected in received, f"Missing message {expected}"
    for i in range(partitions):
        assert f"{topic}-part-{i}" in parts, f"missing partition {topic}-part-{i}"


async def test_partitioned_basic_exclusive(ctx):
    await _partitioned_basic(ctx, "/default/part_basic_excl", SubType.EXCLUSIVE, 3)


async def test_partitioned_basic_shared(ctx):
    await _partitioned_basic(ctx, "/default/part_basic_shared", SubType.SHARED, 3)
