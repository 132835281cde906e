"""Races around topic unload and broker shutdown, over real local storage and sqlite metadata.

Each test drives the broker into the window where an unload (or shutdown) has begun
but not finished, and checks what a client arriving in that window gets.
"""

import asyncio

import pytest

from danube import message_codec
from danube.broker import DispatchSettings
from danube.errors import NotServedHereError
from danube.metadata import keys
from tests.unit.broker.conftest import stop

T = "/default/unloading"
pytestmark = pytest.mark.timeout(30)


def batch(*payloads):
    return bytearray(message_codec.encode_payloads([p.encode() for p in payloads]))


async def receive(broker, cid, n=100):
    return await asyncio.wait_for(broker.receive(cid, max_messages=n, max_bytes=1 << 20), 5)


async def _unload_started(broker, topic):
    """Start unload_topic and return once it has closed the topic but not finished."""
    t = broker.topics[topic]
    task = asyncio.create_task(broker.unload_topic(topic))
    for _ in range(10_000):
        if t.closed:
            break
        await asyncio.sleep(0)
    assert t.closed and not task.done(), "the unload finished before the test could act inside it"
    return task


async def test_clients_arriving_during_an_unload_are_told_to_look_again(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    old = await broker.subscribe(T, "s", "c1", sub_type="shared")
    await broker.publish(pid, batch("a", "b"))
    unload = await _unload_started(broker, T)

    with pytest.raises(NotServedHereError, match="being unloaded") as info:
        await broker.subscribe(T, "s", "c2", sub_type="shared")
    assert info.value.retriable
    with pytest.raises(NotServedHereError, match="being unloaded"):
        await broker.create_producer(T, "p2", reliable=True)
    with pytest.raises(NotServedHereError):
        await broker.publish(pid, batch("c"))
    assert not broker.health("consumer", old)
    assert not broker.health("producer", pid)
    assert await unload == 1

    # once the unload finished, the topic is opened again on demand and continues
    new = await broker.subscribe(T, "s", "c2", sub_type="shared")
    assert broker.health("consumer", new)
    pid2 = await broker.create_producer(T, "p2", reliable=True)
    assert await broker.publish(pid2, batch("c")) == (2, 2)


async def test_an_ack_during_an_unload_is_answered_ok_and_the_message_redelivered(make_broker):
    # no periodic cursor flush during the test: only the unload's own flush may save the cursor
    broker = await make_broker(dispatch=DispatchSettings(cursor_flush_interval_ms=5000))
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch("a", "b", "c", "d"))
    d = await receive(broker, cid)
    assert d.count == 4
    await broker.ack(cid, [0])
    unload = await _unload_started(broker, T)

    answered_ok = []
    for offset, call in (
        (1, broker.ack(cid, [1])),
        (2, broker.ack_subscription(T, "s", [2])),
        (3, broker.ack_ranges(cid, [(3, 3)])),
    ):
        try:
            await call
            answered_ok.append(offset)
        except NotServedHereError:
            pass
    await unload
    persisted = await broker.metadata.get_json(keys.subscription_cursor(T, "s"))
    # acks never fail because of an unload; those arriving while the cursors are being
    # saved for the last time are answered OK but not applied: the messages are delivered again
    assert answered_ok == [1, 2, 3] and persisted == 0 and broker.late_acks == 3
    again = await broker.subscribe(T, "s", "c2")
    d = await receive(broker, again)
    assert d.first_offset == 1 and d.count == 3
    await stop(broker)


async def test_acks_and_nacks_on_a_stopping_broker_are_refused_and_earlier_ones_kept(make_broker):
    b = await make_broker()
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch("a", "b", "c"))
    await receive(b, cid)
    await b.ack(cid, [0, 1])
    t = b.topics[T]
    sub = t.subscriptions["s"]
    stopping = asyncio.create_task(b.stop())
    for _ in range(10_000):
        if t.closed or stopping.done():
            break
        await asyncio.sleep(0)
    assert t.closed and not stopping.done()
    with pytest.raises(NotServedHereError):
        sub.ack([2])
    with pytest.raises(NotServedHereError):
        sub.nack(2)
    await stopping
    await b.metadata.close()

    b = await make_broker()
    assert await b.metadata.get_json(keys.subscription_cursor(T, "s")) == 1
    d = await receive(b, cid)
    assert [bytes(r.payload) for r in message_codec.iter_records(d.frames)] == [b"c"]
    await stop(b)


async def test_shutdown_refuses_new_publishes_and_lets_in_flight_ones_finish(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    in_flight = asyncio.ensure_future(broker.publish(pid, batch("a", "b")))
    await asyncio.sleep(0)  # the batch is being stored
    broker.begin_shutdown()
    with pytest.raises(NotServedHereError, match="shutting down") as info:
        await broker.publish(pid, batch("late"))
    assert info.value.retriable
    with pytest.raises(NotServedHereError, match="shutting down"):
        await broker.publish_one(pid, bytearray(message_codec.encode_payloads([b"late"])))
    assert await broker.drain_publishes(5.0)
    assert in_flight.done() and in_flight.result() == (0, 1)
    assert broker.topics[T].storage.next_offset == 2  # nothing of the refused batches was stored


async def test_a_held_ack_during_an_unload_is_refused_then_applied_after_the_move(make_broker):
    # what a broker's client proxy does with an ack (strict): refused while the topic is sealing,
    # sent again once the topic is open again, where the message was not delivered yet
    broker = await make_broker(dispatch=DispatchSettings(cursor_flush_interval_ms=5000))
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch("a", "b", "c", "d"))
    assert (await receive(broker, cid)).count == 4
    await broker.ack_subscription(T, "s", [0], strict=True)
    unload = await _unload_started(broker, T)
    with pytest.raises(NotServedHereError) as refused:
        await broker.ack_subscription(T, "s", [1], strict=True)
    assert refused.value.retriable
    with pytest.raises(NotServedHereError):
        await broker.nack_subscription(T, "s", 2, strict=True)
    await unload
    assert await broker.metadata.get_json(keys.subscription_cursor(T, "s")) == 0
    assert broker.late_acks == 0
    # the new owner: the held ack of 1 lands before the consumer re-subscribed (the subscription is
    # opened from its stored record), the one of 2 after; nothing was delivered here yet, so those
    # two are never delivered again
    await broker.ack_subscription(T, "s", [1], strict=True)
    assert broker.topics[T].subscriptions["s"].early_acks == {1}
    again = await broker.subscribe(T, "s", "c2")
    await broker.ack_subscription(T, "s", [2], strict=True)
    d = await receive(broker, again)
    assert (d.first_offset, d.count) == (3, 1)
    await broker.ack(again, [3])
    await broker.flush_cursors(force=True)
    assert await broker.metadata.get_json(keys.subscription_cursor(T, "s")) == 3
    await stop(broker)


async def test_a_held_ack_for_a_subscription_not_open_yet_is_refused_not_lost(make_broker):
    broker = await make_broker()
    pid = await broker.create_producer(T, "p", reliable=True)
    await broker.publish(pid, batch("a"))
    with pytest.raises(NotServedHereError, match="not applied"):
        await broker.ack_subscription(T, "nobody-yet", [0], strict=True)
    await broker.ack_subscription(T, "nobody-yet", [0])  # Danube's own path: answered OK, counted
    assert broker.late_acks == 1
    await stop(broker)


async def test_early_acks_out_of_order_are_settled_on_delivery_and_beyond_the_end_ignored(make_broker):
    broker = await make_broker(dispatch=DispatchSettings(cursor_flush_interval_ms=5000))
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch("a", "b", "c"))
    # acks of offsets this broker has not delivered (2) and of one not stored at all (7)
    await broker.ack_subscription(T, "s", [2, 7], strict=True)
    sub = broker.topics[T].subscriptions["s"]
    assert sub.early_acks == {2}
    d = await receive(broker, cid)
    assert (d.first_offset, d.count) == (0, 3)  # 0 was never acked: delivered with what follows
    assert not sub.early_acks and sub.tracker.unacked == 2  # 2 was settled on delivery
    await broker.ack(cid, [0, 1])
    assert sub.tracker.cursor == 2
    await broker.publish(pid, batch("d"))
    d = await receive(broker, cid)
    assert (d.first_offset, d.count) == (3, 1)  # offset 7's early ack was not kept
    await stop(broker)
