"""danube.client follows `topics unload`: the SAME producer and consumer objects carry on.

A real broker process (local storage, sync always), the admin gRPC service's
UnloadTopic (what `danube admin topics unload` calls), and the project's client
in this process.  After each unload the broker answers CLOSE for the old ids;
the producer re-creates itself (offsets continue) and the consumer re-subscribes
(resumes at the persisted cursor) without the application seeing an error.
The real danube-client 0.5.0's producer does the same, in its own venv
(tests/support/danube_client_venv.py): its send retries the old owner's UNAVAILABLE,
then looks the topic up again and re-creates the producer.
"""

from __future__ import annotations

import asyncio
import re

import grpc

from danube.client import DanubeClient, SubType
from danube.proto.danube_admin import admin_pb2, admin_pb2_grpc
from tests.support.broker import running_broker
from tests.support.waiting import async_wait_until

TOPIC = "/default/follows_unload"


async def _unload(broker, topic: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        await admin_pb2_grpc.TopicAdminStub(channel).UnloadTopic(admin_pb2.TopicRequest(name=topic), timeout=30)


def _health_tasks() -> list[asyncio.Task]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name() == "danube-health-checker" and not t.done() and not t.cancelling()
    ]


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


async def test_same_producer_and_consumer_follow_unloads(tmp_path):
    (tmp_path / "broker").mkdir()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        client = (
            DanubeClient.builder()
            .service_url(broker.url)
            .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
            .with_health_check_interval(0.5)
            .build()
        )
        try:
            consumer = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name("c1")
                .with_subscription("subs")
                .with_subscription_type(SubType.Exclusive)
                .with_reliable()
                .build()
            )  # creates the topic: no producer yet
            await consumer.subscribe()  # a new subscription starts at the latest offset: before producing
            producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_linger_ms(1).build()
            await producer.create()
            (producer_id,) = producer.producer_ids

            futures = [await producer.send(b"message-%d" % i) for i in range(22)]
            assert await asyncio.wait_for(asyncio.gather(*futures), 30) == list(range(22))

            reader = Reader(consumer)
            await reader.read_until(13, ack_up_to=9)  # 0..9 acked; 10..13 delivered, not acked
            assert reader.acked == set(range(10))

            # Unload 1: sends right away (the batch may come back UNAVAILABLE before any health check).
            await _unload(broker, TOPIC)
            futures = [await producer.send(b"message-%d" % i) for i in range(22, 25)]
            assert await asyncio.wait_for(asyncio.gather(*futures), 30) == [22, 23, 24]
            assert producer._parts[0].reconnects == 1
            assert producer.producer_ids == [producer_id]
            for message in reader.unacked:  # the application acks late: after the move
                await consumer.ack(message)
                reader.acked.add(message.offset)
            reader.unacked.clear()
            await reader.read_until(24)

            # Unload 2 while idle: only the health check's CLOSE brings the producer back.
            await _unload(broker, TOPIC)
            await async_wait_until(lambda: producer._parts[0].reconnects == 2, 15, "the second reconnect")
            offsets = await (await producer.send_batch([b"message-%d" % i for i in range(25, 28)]))
            assert offsets == [25, 26, 27]
            await reader.read_until(27)

            assert sorted(set(reader.handed_out)) == list(range(28)), "none missing"
            assert reader.acked == set(range(28))
            # Redelivered: at most what was delivered but not acked before the first unload.
            repeated = {o for o in reader.handed_out if reader.handed_out.count(o) > 1}
            assert repeated <= set(range(10, 22)), repeated
            assert consumer._parts[0].resubscribes >= 2
            await asyncio.sleep(1.0)  # nothing acked comes back later either
            assert await consumer.receive_batch(timeout=0.5) is None

            await producer.close()
            await consumer.close()
            assert _health_tasks() == []

            # The broker has every ack (the redelivered ones were acked again): after one more
            # unload, a fresh consumer of the subscription resumes past 27 and gets nothing old.
            await _unload(broker, TOPIC)
            fresh = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name("c1")
                .with_subscription("subs")
                .with_subscription_type(SubType.Exclusive)
                .build()
            )
            await fresh.subscribe()
            assert await fresh.receive_batch(timeout=1.0) is None
            await fresh.close()
        finally:
            await client.close()
        assert "Traceback" not in broker.log(), broker.log()


async def test_danube_client_producer_follows_unloads_by_itself(tmp_path):
    """The real danube-client 0.5.0: one producer, a plain send loop (tests/e2e/danube_client_scripts/
    move_produce.py), three unloads under it.  Each send after an unload gets UNAVAILABLE from the
    broker, the client retries, looks the topic up again and re-creates its producer: no send raises
    and every message sent is stored once, in order."""
    from tests.support import danube_client_venv as dc

    try:
        dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        import pytest

        pytest.skip(f"danube-client venv not available: {exc}")
    topic = "/default/dc_follows_unload"
    (tmp_path / "broker").mkdir()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        client = (
            DanubeClient.builder()
            .service_url(broker.url)
            .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=30)
            .with_health_check_interval(0.5)
            .build()
        )
        try:
            consumer = (
                client.new_consumer()
                .with_topic(topic)
                .with_consumer_name("c1")
                .with_subscription("all")
                .with_subscription_type(SubType.Exclusive)
                .with_reliable()
                .build()
            )
            await consumer.subscribe()  # creates the topic; the subscription starts before any message
            script = dc.start_script(
                "move_produce.py", broker.url, topic, "--count", "120", "--prefix", "d", "--delay-ms", "25"
            )
            try:
                received: list[tuple[int, bytes]] = []
                loop = asyncio.get_running_loop()
                for _ in range(3):
                    deadline = loop.time() + 20
                    before = len(received)
                    while len(received) < before + 10:  # the producer is sending: unload under it
                        assert loop.time() < deadline, f"no progress after {len(received)} messages"
                        assert script.poll() is None, script.communicate()
                        batch = await consumer.receive_batch(timeout=0.5)
                        for m in batch.messages() if batch is not None else ():
                            received.append((m.offset, m.payload))
                            await consumer.ack(m)
                    await _unload(broker, topic)
                out, err = await asyncio.to_thread(script.communicate, timeout=120)
            except BaseException:
                script.kill()
                script.communicate()
                raise
            result = dc.parse_result("move_produce.py", script.returncode, out, err)
            assert result["error"] is None, result["error"]
            sent = result["sent"]
            assert len(sent) == 120
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while len({p for _, p in received}) < len(sent):
                assert loop.time() < deadline, f"{len(received)} of {len(sent)} received"
                batch = await consumer.receive_batch(timeout=0.5)
                for m in batch.messages() if batch is not None else ():
                    received.append((m.offset, m.payload))
                    await consumer.ack(m)
            stored = dict(received)  # offset -> payload (a redelivery repeats both)
            assert sorted(stored) == list(range(len(sent))), "each message stored once, no gap"
            assert [stored[o].decode() for o in sorted(stored)] == sent, "in the order sent"
            await consumer.close()
        finally:
            await client.close()
        log = broker.log()
        assert "Traceback" not in log, log
        # the client re-created its producer after each unload (same name, a new id each time)
        assert len(re.findall(r"producer 'dp' \(\d+\) on " + topic, log)) == 4, log
