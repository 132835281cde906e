"""Beyond Danube's suite, cluster only: a dead-letter topic owned by another broker than the
subscription's topic still receives the poisoned message, with Danube's attributes."""

import asyncio

from common import consumer, producer, recv
from danube_admin import failure_policy
from reliable_topic_move_shared_fs import wait_for_assignment

from danube import SubType


async def test_dead_letter_to_a_topic_another_broker_owns(ctx):
    client = await ctx.client()
    topic = ctx.unique_topic("/default/cluster_dlq_source")
    await ctx.admin.create_topic(topic, "reliable")
    p = await producer(client, topic, "producer_cluster_dlq", reliable=True)
    source = await wait_for_assignment(ctx, topic)
    dlq_topic = None
    for i in range(12):  # topics are placed by load: try names until one lands elsewhere
        candidate = f"{topic}-dlq-{i}"
        await ctx.admin.create_topic(candidate, "reliable")
        await producer(client, candidate, f"placer-{i}", reliable=True)
        if (await wait_for_assignment(ctx, candidate))["broker_id"] != source["broker_id"]:
            dlq_topic = candidate
            break
    assert dlq_topic, "no candidate dead-letter topic was placed on another broker"
    subscription = "sub_cluster_dlq"
    await ctx.admin.set_failure_policy(topic, subscription, failure_policy(0, 5_000, "dead_letter", dlq_topic))
    c = await consumer(client, topic, "consumer_cluster_dlq", subscription, SubType.EXCLUSIVE)
    stream = await c.receive()
    dlq = await consumer(client, dlq_topic, "consumer_cluster_dlq_reader", "sub_cluster_dlq_reader")
    dlq_stream = await dlq.receive()
    await asyncio.sleep(0.2)
    await p.send(b"to-remote-dlq", None)
    first = await recv(stream, ctx.t(5), "first delivery")
    await c.nack(first, 0, "dead-letter it")
    dead = await recv(dlq_stream, ctx.t(10), "the message on the other broker's dead-letter topic")
    assert dead.payload == b"to-remote-dlq"
    assert dead.attributes.get("x-original-topic") == topic
    assert dead.attributes.get("x-original-subscription") == subscription
    assert dead.attributes.get("x-poison-policy") == "dead_letter"
    assert dead.attributes.get("x-failure-reason") == "dead-letter it"
