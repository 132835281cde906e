"""Redelivery after a move is bounded by the consumer's in-flight window (``late_acks``).

A real broker process (standalone: ``topics unload`` seals and reloads the topic through the same
``BrokerService.unload_topic`` a cluster move uses), a ``danube.client`` consumer whose receive credit
is ``WINDOW`` messages, slower than the producer so its window is always full, and one unload
mid-stream.  Acks that reach the broker after the topic closed are answered OK and not applied
(``late_acks``); the reloaded topic delivers again from the persisted cursor.  Counted twice: the
offsets the broker delivered more than once (what the consumer's streams received, before the
client drops redeliveries of offsets it already acked) and the messages the application got twice.
Both stay within the window, and every message the producer got an ack for is delivered.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time

import grpc

from danube.client import DanubeClient, SubType
from danube.proto.danube_admin import admin_pb2, admin_pb2_grpc
from tests.support.broker import running_broker
from tests.support.waiting import async_wait_until

TOPIC = "/default/redelivery_after_move"
WINDOW = 64  # the consumer's receive credit: messages in flight between broker and application
MESSAGES = 3000
UNLOAD_AT = 800  # messages the application has taken when the topic is unloaded


async def _unload(broker, topic: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.admin_port}") as channel:
        await admin_pb2_grpc.TopicAdminStub(channel).UnloadTopic(admin_pb2.TopicRequest(name=topic), timeout=30)


async def test_redelivery_after_a_move_is_bounded_by_the_consumers_window(tmp_path):
    started = time.monotonic()
    (tmp_path / "broker").mkdir()
    # the broker logs each late ack at DEBUG (danube.broker.service): that logger alone at DEBUG, so the
    # test can count them
    (tmp_path / "debug").mkdir()
    (tmp_path / "debug" / "sitecustomize.py").write_text(
        'import logging\nlogging.getLogger("danube.broker.service").setLevel(logging.DEBUG)\n'
    )
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "debug"), os.environ.get("PYTHONPATH")) if p)
    with running_broker(data_dir=str(tmp_path / "broker"), env={"PYTHONPATH": pythonpath}) as broker:
        client = (
            DanubeClient.builder()
            .service_url(broker.url)
            .with_retry(initial_backoff_s=0.05, max_backoff_s=0.5, give_up_after_s=15)
            .with_health_check_interval(0.5)
            .build()
        )
        try:
            consumer = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name("c")
                .with_subscription("s")
                .with_subscription_type(SubType.Exclusive)
                .with_reliable()
                .with_receive_credit(WINDOW, 64 * 1024 * 1024)
                .build()
            )
            wire: list[int] = []  # every offset the broker delivered, in order, redeliveries included
            deliver = consumer.deliver

            def counting_deliver(batch):
                wire.extend(batch.offsets())
                deliver(batch)

            consumer.deliver = counting_deliver
            await consumer.subscribe()  # creates the topic; the subscription starts before any message
            producer = client.new_producer().with_topic(TOPIC).with_name("p").with_linger_ms(1).build()
            await producer.create()

            acked: dict[int, bytes] = {}  # offset -> payload, as the producer's acks said
            seen: list[tuple[int, bytes]] = []  # what the application got, in order

            async def produce():
                pending = set()
                for i in range(MESSAGES):
                    payload = b"m-%d" % i
                    fut = await producer.send(payload)
                    fut.add_done_callback(
                        lambda f, p=payload: (
                            acked.__setitem__(f.result(), p) if not f.cancelled() and f.exception() is None else None
                        )
                    )
                    pending.add(fut)
                    if len(pending) >= 200:
                        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if pending:
                    await asyncio.wait(pending, timeout=15)

            async def consume():
                async for m in consumer:
                    seen.append((m.offset, m.payload))
                    await consumer.ack(m)
                    await asyncio.sleep(0.001)  # slower than the producer: the window stays full

            async def wait_for(predicate, timeout: float, what: str):
                def reached():  # the consumer's own failure ends the wait with its error
                    assert not consuming.done(), consuming.exception() if not consuming.cancelled() else "cancelled"
                    return predicate()

                await async_wait_until(reached, timeout, what, interval=0.02)

            consuming = asyncio.ensure_future(consume())
            producing = asyncio.ensure_future(produce())
            await wait_for(lambda: len(seen) >= UNLOAD_AT, 15, f"{UNLOAD_AT} messages consumed")
            backlog = len(acked) - len(seen)
            await _unload(broker, TOPIC)
            unloaded_at = len(seen)
            await asyncio.wait_for(producing, 20)
            assert len(acked) == MESSAGES, f"{len(acked)} of {MESSAGES} sends acked"
            await wait_for(lambda: {o for o, _ in seen} >= set(acked), 15, "every acked message delivered")
            await asyncio.sleep(0.5)  # a late redelivery would show here
            consuming.cancel()
            await asyncio.gather(consuming, return_exceptions=True)

            # nothing lost: every acked offset delivered with its payload, offsets 0..N-1
            delivered = dict(seen)
            assert all(delivered.get(o) == p for o, p in acked.items())
            assert sorted(delivered) == list(range(MESSAGES))
            # a move happened under the consumer (it re-subscribed) while it had a full window
            assert consumer._parts[0].resubscribes >= 1
            assert backlog > WINDOW, "the producer was not ahead of the consumer at the unload"
            # redeliveries: within the in-flight window
            redelivered = sum(n - 1 for n in collections.Counter(wire).values())
            seen_twice = sum(n - 1 for n in collections.Counter(o for o, _ in seen).values())
            assert redelivered >= 1, "nothing was in flight at the move"
            assert redelivered <= WINDOW, f"{redelivered} offsets delivered again after the move (window {WINDOW})"
            assert seen_twice <= WINDOW, f"the application got {seen_twice} messages twice (window {WINDOW})"
            await producer.close()
            await consumer.close()
        finally:
            await client.close()
        with open(broker.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert "Traceback" not in log, log[-3000:]
        assert f"topic {TOPIC} unloaded (sealed at offset" in log
        late_acks = log.count("accepted after its topic left this broker")
    print(
        f"window {WINDOW}: unloaded after {unloaded_at} taken; the broker delivered {redelivered} offset(s) "
        f"again ({late_acks} late ack(s) answered OK), the application got {seen_twice} twice; "
        f"{time.monotonic() - started:.1f} s"
    )
