"""One dispatcher class per subscription type (danube.broker.dispatch), through BrokerService."""

import asyncio

import pytest

from danube import message_codec
from danube.broker.dispatch import DISPATCHERS, SUB_TYPES
from danube.broker.dispatch.exclusive import ExclusiveDispatcher
from danube.broker.dispatch.failover import FailoverDispatcher
from danube.broker.dispatch.key_shared import KeySharedDispatcher
from danube.broker.dispatch.shared import SharedDispatcher
from danube.errors import InvalidArgumentError

T = "/default/dispatch"


def batch(payloads, key=None):
    return bytearray(message_codec.encode_payloads([p.encode() for p in payloads], key=key))


def payloads(delivery):
    return [bytes(r.payload).decode() for r in message_codec.iter_records(delivery.frames)]


async def receive(broker, cid, timeout=2.0):
    return await asyncio.wait_for(broker.receive(cid, max_messages=100, max_bytes=1 << 20), timeout)


async def test_each_subscription_type_gets_its_dispatcher(broker):
    assert SUB_TYPES == ("exclusive", "shared", "failover", "key_shared")
    expected = {
        "exclusive": ExclusiveDispatcher,
        "shared": SharedDispatcher,
        "failover": FailoverDispatcher,
        "key_shared": KeySharedDispatcher,
    }
    assert DISPATCHERS == expected
    for sub_type, cls in expected.items():
        await broker.subscribe(T, f"s-{sub_type}", "c", sub_type=sub_type)
        sub = broker.topics[T].subscriptions[f"s-{sub_type}"]
        assert type(sub.dispatcher) is cls and sub.sub_type == sub_type == sub.stats().sub_type


async def test_unknown_types_and_misplaced_key_filters_are_refused(broker):
    with pytest.raises(InvalidArgumentError, match="unknown subscription type 'round_robin'"):
        await broker.subscribe(T, "s", "c", sub_type="round_robin")
    with pytest.raises(InvalidArgumentError, match="key filters apply to key_shared"):
        await broker.subscribe(T, "s", "c", sub_type="shared", key_filters=["a-*"])


async def test_key_shared_subscribing_again_with_other_filters_reroutes(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="key_shared", key_filters=["eu-*"])
    b = await broker.subscribe(T, "s", "b", sub_type="key_shared", key_filters=["us-*"])
    assert await broker.subscribe(T, "s", "a", sub_type="key_shared", key_filters=["us-*", "eu-*"]) == a
    assert await broker.subscribe(T, "s", "b", sub_type="key_shared", key_filters=["none-*"]) == b
    await broker.publish(pid, batch(["1"], key="us-east"))
    assert payloads(await receive(broker, a)) == ["1"]  # b no longer accepts us-*


async def test_key_shared_a_joining_consumer_waits_until_earlier_reads_are_acked(broker):
    """A consumer joining takes keys over from one that still holds their earlier messages unacked:
    what is read after the join waits until everything read before it was acked (each key in order)."""
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="key_shared")
    keys = [f"k{i}" for i in range(20)]
    for k in keys:
        await broker.publish(pid, batch([f"{k}:0"], key=k))
    first = await receive(broker, a)  # every key's first message, unacked
    assert len(payloads(first)) == len(keys)
    b = await broker.subscribe(T, "s", "b", sub_type="key_shared")
    for k in keys:
        await broker.publish(pid, batch([f"{k}:1"], key=k))
    with pytest.raises(asyncio.TimeoutError):  # b's keys wait for a's acks
        await receive(broker, b, timeout=0.5)
    await broker.ack(a, range(first.first_offset, first.last_offset + 1))
    got = payloads(await receive(broker, b))
    got += payloads(await receive(broker, a))
    assert sorted(got) == sorted(f"{k}:1" for k in keys) and len(got) == len(keys)


async def test_key_shared_a_joining_consumer_does_not_wait_for_a_delayed_redelivery(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="key_shared")
    keys = [f"k{i}" for i in range(20)]
    for k in keys:
        await broker.publish(pid, batch([f"{k}:0"], key=k))
    first = await receive(broker, a)
    b = await broker.subscribe(T, "s", "b", sub_type="key_shared")
    await broker.nack(a, first.first_offset, delay_ms=60_000)  # waits for redelivery, not in flight
    await broker.ack(a, range(first.first_offset + 1, first.last_offset + 1))
    for k in keys:
        await broker.publish(pid, batch([f"{k}:1"], key=k))
    got = payloads(await receive(broker, b))
    assert got and all(p.endswith(":1") for p in got)


async def test_key_shared_nack_comes_back_to_the_key_owner(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="key_shared")
    await broker.publish(pid, batch(["x", "y"], key="k"))
    d = await receive(broker, cid)
    assert payloads(d) == ["x", "y"]
    await broker.nack(cid, d.first_offset, delay_ms=0)
    again = await receive(broker, cid)
    assert payloads(again) == ["x"] and again.redelivery_counts == {d.first_offset: 1}


async def test_a_new_stream_gets_what_was_routed_to_the_old_one(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="key_shared")
    await broker.publish(pid, batch(["a", "b", "c"], key="k"))
    first = await asyncio.wait_for(broker.receive(cid, max_messages=1, max_bytes=1 << 20), 2)
    assert payloads(first) == ["a"]  # b and c wait in c's queue
    await broker.open_stream(cid)
    got = []
    while len(got) < 3:
        got += payloads(await receive(broker, cid))
    assert sorted(got) == ["a", "b", "c"]
