"""The producer under overload around a cutover (docs/repartition.md, Measurements).

The cutover re-routes the refused and unsent backlog in batches of the usual size: before, every
re-routed message of a partition went into one open batch (2-7 MB per partition measured), none
of whose messages is acked until all of it is stored, and one that can outgrow the broker's
message size limit.  And send() lets the event loop run even when it never has to wait.
"""

from __future__ import annotations

import asyncio
import types

from danube.client.connection import RetryPolicy
from danube.client.partition_router import PartitionRouter, partition_topic
from danube.client.producer import Producer
from danube.client.producer_batch import FRAME_OVERHEAD, Batch
from danube.client.producer_stream import PartitionProducer


def _producer(partitions: int, max_batch_bytes: int) -> Producer:
    client = types.SimpleNamespace(retry=RetryPolicy())
    producer = Producer(client, "/ns/t", "p", partitions=partitions, max_batch_bytes=max_batch_bytes)
    producer._parts = [PartitionProducer(producer, partition_topic("/ns/t", i)) for i in range(partitions)]
    producer._router = PartitionRouter(partitions)
    producer.partitioning_version = 2
    return producer


def _queued(part: PartitionProducer) -> list[Batch]:
    out = []
    while not part._to_send.empty():
        _, batch = part._to_send.get_nowait()
        out.append(batch)
    return out


def test_a_rerouted_backlog_is_split_at_max_batch_bytes_keeping_per_key_order():
    async def scenario():
        loop = asyncio.get_running_loop()
        payload = b"p" * 100
        per_batch = 20
        producer = _producer(4, max_batch_bytes=per_batch * (len(payload) + FRAME_OVERHEAD))
        keys = [f"k{i % 37}" for i in range(3000)]
        futures = [loop.create_future() for _ in keys]
        # the old routing's backlog, as the cutover hands it over: several batches, in order
        for lo in range(0, len(keys), 500):
            batch = Batch([payload] * 500, keys[lo : lo + 500], [None] * 500, futures[lo : lo + 500])
            producer._reroute(batch)
        for part in producer._parts:
            part.seal()
        seen: dict[str, list[int]] = {}
        total = 0
        for index, part in enumerate(producer._parts):
            batches = _queued(part)
            assert len(batches) > 1
            for batch in batches:
                assert len(batch.payloads) <= per_batch
                assert batch.version == 2
                for key, fut in zip(batch.keys, batch.futures):
                    assert producer._router.route(key) == index
                    seen.setdefault(key, []).append(futures.index(fut))
                total += len(batch.payloads)
        assert total == len(keys)
        for key, positions in seen.items():
            assert positions == sorted(positions), key  # each key's messages in publish order
            assert positions == [i for i, k in enumerate(keys) if k == key]

    asyncio.run(scenario())


def test_a_sender_that_never_waits_still_lets_the_event_loop_run():
    """Overloaded, a caller awaiting send() in a loop never suspends while a window has room: the
    acks and the publish streams would wait until every partition's window is full (a 1 s stall
    of the loop right after a grow re-routed the backlog into 4 partitions' windows)."""

    async def scenario():
        producer = _producer(2, max_batch_bytes=256 * 1024)
        producer.max_in_flight = 1_000_000  # room for everything: send() never waits for space
        turns = 0
        stop = False

        async def other_task():
            nonlocal turns
            while not stop:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(other_task())
        await asyncio.sleep(0)
        turns = 0
        futures = [await producer.send(b"x", key=f"k{i}") for i in range(2000)]
        seen = turns
        stop = True
        await other
        assert len(futures) == 2000
        assert seen >= 2000 // 256 - 1  # a turn for the other task at least every 256 messages
        for part in producer._parts:
            part.seal()
        assert sum(len(b.payloads) for part in producer._parts for b in _queued(part)) == 2000

    asyncio.run(scenario())
