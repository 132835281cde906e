"""Failure policies as Danube applies them: max_redelivery_count 0, the dead-letter attributes,
and the block policy on key-shared subscriptions stalling only the poisoned key."""

import asyncio

import pytest

from danube import message_codec
from danube.broker import FailurePolicy
from tests.unit.broker.conftest import stop

T = "/default/topic"


def batch(payloads, key=None, producer_id=0):
    return bytearray(message_codec.encode_payloads([p.encode() for p in payloads], key=key, producer_id=producer_id))


def payloads(delivery):
    return [bytes(r.payload).decode() for r in message_codec.iter_records(delivery.frames)]


async def receive(broker, cid, timeout=2.0):
    return await asyncio.wait_for(broker.receive(cid, max_messages=100, max_bytes=1 << 20), timeout)


def policy(**kw):
    return FailurePolicy(ack_timeout_ms=60_000, base_redelivery_delay_ms=10, max_redelivery_delay_ms=10, **kw)


async def test_max_redelivery_count_zero_means_no_redelivery(make_broker):
    b = await make_broker(failure_policy=policy(max_redelivery_count=0, poison_policy="drop"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["poison"]))
    d = await receive(b, cid)
    await b.nack(cid, d.first_offset)  # the first failure already drops it
    await b.publish(pid, batch(["next"]))
    assert payloads(await receive(b, cid)) == ["next"]
    await stop(b)


async def test_max_redelivery_count_counts_redeliveries(make_broker):
    b = await make_broker(failure_policy=policy(max_redelivery_count=2, poison_policy="drop"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["poison"]))
    deliveries = 0
    while True:
        d = await receive(b, cid)
        if payloads(d) != ["poison"]:
            break
        deliveries += 1
        await b.nack(cid, d.first_offset)
        if deliveries == 3:
            await b.publish(pid, batch(["next"]))
    assert deliveries == 3 and payloads(d) == ["next"]  # the first delivery and 2 redeliveries
    await stop(b)


async def test_dead_letter_carries_danubes_attributes(make_broker):
    b = await make_broker(
        failure_policy=policy(max_redelivery_count=1, poison_policy="dead_letter", dead_letter_topic="/default/dlq")
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["bad"], producer_id=pid))
    for reason in ("first", "second"):
        d = await receive(b, cid)
        await b.nack(cid, d.first_offset, reason=reason)
    for _ in range(100):
        if "/default/dlq" in b.topics and b.topics["/default/dlq"].storage.next_offset == 1:
            break
        await asyncio.sleep(0.02)
    rec = message_codec.decode_batch(await b.topics["/default/dlq"].storage.read_frames(0, 1 << 20))[0]
    attrs = dict(rec.attributes)
    assert bytes(rec.payload) == b"bad"
    assert {
        k: attrs[k]
        for k in (
            "x-original-topic",
            "x-original-subscription",
            "x-original-topic-offset",
            "x-poison-policy",
            "x-delivery-attempt",
            "x-failure-reason",
        )
    } == {
        "x-original-topic": T,
        "x-original-subscription": "s",
        "x-original-topic-offset": "0",
        "x-poison-policy": "dead_letter",
        "x-delivery-attempt": "2",
        "x-failure-reason": "second",
    }
    assert int(attrs["x-original-producer-id"]) == pid
    await stop(b)


async def test_key_shared_block_stalls_only_the_poisoned_key(make_broker):
    b = await make_broker(failure_policy=policy(max_redelivery_count=0, poison_policy="block"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c", sub_type="key_shared")
    await b.publish(pid, batch(["bad"], key="k1"))
    d = await receive(b, cid)
    await b.nack(cid, d.first_offset)  # k1 is blocked
    await b.publish(pid, batch(["k1-later"], key="k1"))
    await b.publish(pid, batch(["k2-a"], key="k2"))
    d = await receive(b, cid)
    assert payloads(d) == ["k2-a"]  # other keys flow
    await b.ack(cid, [d.first_offset])
    with pytest.raises(asyncio.TimeoutError):
        await receive(b, cid, timeout=0.3)  # k1 still held
    sub = b.topics[T].subscriptions["s"]
    assert sub.cursor == -1  # the cursor waits at the block
    assert sub.unblock() == 1  # an admin releases it
    d = await receive(b, cid)
    assert payloads(d) == ["k1-later"]  # in order, nothing lost
    await b.ack(cid, [d.first_offset])
    for _ in range(50):
        if sub.cursor == 2:
            break
        await asyncio.sleep(0.02)
    assert sub.cursor == 2
    await stop(b)


async def test_exclusive_block_still_stalls_the_subscription(make_broker):
    b = await make_broker(failure_policy=policy(max_redelivery_count=0, poison_policy="block"))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["bad"], key="k1"))
    d = await receive(b, cid)
    await b.nack(cid, d.first_offset)
    await b.publish(pid, batch(["other"], key="k2"))
    with pytest.raises(asyncio.TimeoutError):
        await receive(b, cid, timeout=0.3)
    await stop(b)
