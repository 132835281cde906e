"""danube-broker/tests/partitioning_validation.rs: non-partitioned and 3-partition topics name their partitions."""

import asyncio

from common import consumer, producer, recv


async def test_partitioning_validation(ctx):
    client = await ctx.client()
    np_topic = "/default/partitioning_validation_np"
    np_p = await producer(client, np_topic, "producer_part_np_lookup")
    np_c = await consumer(client, np_topic, "consumer_np", "sub_np")
    np_stream = await np_c.receive()
    await asyncio.sleep(0.2)
    await np_p.send(b"np", None)
    np_msg = await recv(np_stream, ctx.t(5), "the np message")
    assert np_msg.msg_id.topic_name == np_topic

    p_topic = "/default/partitioning_validation"
    partitions = 3
    p_p = await producer(client, p_topic, "producer_part_lookup", partitions=partitions)
    p_c = await consumer(client, p_topic, "consumer_p", "sub_p")
    p_stream = await p_c.receive()
    await asyncio.sleep(0.3)
    for i in range(partitions * 2):
        await p_p.send(f"p{i}".encode(), None)
    seen = set()

    async def collect():
        while len(seen) < partitions:
            seen.add((await p_stream.get()).msg_id.topic_name)

    try:  # (Danube's test ignores the timeout and then checks the partitions seen)
        await asyncio.wait_for(collect(), ctx.t(10))
    except asyncio.TimeoutError:
        pass
    for i in range(partitions):
        assert f"{p_topic}-part-{i}" in seen, f"missing partition {p_topic}-part-{i}"
