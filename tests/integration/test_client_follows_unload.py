"""danube.client follows `topics unload`: the SAME producer and consumer objects carry on.

A real broker process (local storage, sync always), the admin gRPC service's
UnloadTopic (what `danube admin topics unload` calls), and the project's client
in this process.  After each unload the broker answers CLOSE for the old ids;
the producer re-creates itself (offsets continue) and the consumer re-subscribes
(resumes at the persisted cursor) without the application seeing an error.
"""

from __future__ import annotations

import asyncio

import grpc

from danube.client import DanubeClient, SubType
from danube.proto.danube_admin import admin_pb2, admin_pb2_grpc
from tests.support.broker import running_broker

TOPIC = "/default/follows_unload"


async def _unload(broker, topic: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        await admin_pb2_grpc.TopicAdminStub(channel).UnloadTopic(admin_pb2.TopicRequest(name=topic), timeout=30)


def _health_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if "HealthWatch._run" in repr(t.get_coro()) and not t.done()]


class Reader:
    """Takes batches from one consumer, acks what it is told to, and checks no acked message comes back."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.handed_out: list[int] = []
        self.acked: set[int] = set()
        self.unacked: list = []

    async def read_until(self, last_offset: int, *, ack_up_to: int | None = None, timeout: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.handed_out or max(self.handed_out) < last_offset or not self._complete(last_offset):
            batch = await self.consumer.receive_batch(timeout=max(0.1, deadline - loop.time()))
            assert batch is not None, f"no delivery; handed out so far: {self.handed_out}"
            for message in batch.messages():
                assert message.offset not in self.acked, f"acked message {message.offset} handed out again"
                assert message.payload == b"message-%d" % message.offset, "payload belongs to its offset"
                self.handed_out.append(message.offset)
                if ack_up_to is None or message.offset <= ack_up_to:
                    await self.consumer.ack(message)
                    self.acked.add(message.offset)
                else:
                    self.unacked.append(message)

    def _complete(self, last_offset: int) -> bool:
        return set(range(last_offset + 1)) <= set(self.handed_out)


async def _wait_until(predicate, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_same_producer_and_consumer_follow_unloads(tmp_path):
    (tmp_path / "broker").mkdir()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        client = (DanubeClient.builder().service_url(broker.url)
                  .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
                  .with_health_check_interval(0.5).build())
        try:
            consumer = (client.new_consumer().with_topic(TOPIC).with_consumer_name("c1")
                        .with_subscription("subs").with_subscription_type(SubType.Exclusive)
                        .with_reliable().build())  # creates the topic: no producer yet
            await consumer.subscribe()   # a new subscription starts at the latest offset: before producing
            producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_linger_ms(1).build()
            await producer.create()
            (producer_id,) = producer.producer_ids

            futures = [await producer.send(b"message-%d" % i) for i in range(22)]
            assert await asyncio.wait_for(asyncio.gather(*futures), 30) == list(range(22))

            reader = Reader(consumer)
            await reader.read_until(13, ack_up_to=9)   # 0..9 acked; 10..13 delivered, not acked
            assert reader.acked == set(range(10))

            # Unload 1: sends right away (the batch may come back UNAVAILABLE before any health check).
            await _unload(broker, TOPIC)
            futures = [await producer.send(b"message-%d" % i) for i in range(22, 25)]
            assert await asyncio.wait_for(asyncio.gather(*futures), 30) == [22, 23, 24]
            assert producer._parts[0].reconnects == 1
            assert producer.producer_ids == [producer_id]
            for message in reader.unacked:             # the application acks late: after the move
                await consumer.ack(message)
                reader.acked.add(message.offset)
            reader.unacked.clear()
            await reader.read_until(24)

            # Unload 2 while idle: only the health check's CLOSE brings the producer back.
            await _unload(broker, TOPIC)
            await _wait_until(lambda: producer._parts[0].reconnects == 2)
            offsets = await (await producer.send_batch([b"message-%d" % i for i in range(25, 28)]))
            assert offsets == [25, 26, 27]
            await reader.read_until(27)

            assert sorted(set(reader.handed_out)) == list(range(28)), "none missing"
            assert reader.acked == set(range(28))
            # Redelivered: at most what was delivered but not acked before the first unload.
            repeated = {o for o in reader.handed_out if reader.handed_out.count(o) > 1}
            assert repeated <= set(range(10, 22)), repeated
            assert consumer._parts[0].resubscribes >= 2
            await asyncio.sleep(1.0)                   # nothing acked comes back later either
            assert await consumer.receive_batch(timeout=0.5) is None

            await producer.close()
            await consumer.close()
            assert _health_tasks() == []

            # The broker has every ack (the redelivered ones were acked again): after one more
            # unload, a fresh consumer of the subscription resumes past 27 and gets nothing old.
            await _unload(broker, TOPIC)
            fresh = (client.new_consumer().with_topic(TOPIC).with_consumer_name("c1")
                     .with_subscription("subs").with_subscription_type(SubType.Exclusive).build())
            await fresh.subscribe()
            assert await fresh.receive_batch(timeout=1.0) is None
            await fresh.close()
        finally:
            await client.close()
        assert "Traceback" not in broker.log(), broker.log()
