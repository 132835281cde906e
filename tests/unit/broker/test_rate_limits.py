"""Topic policies max_publish_rate and max_subscription_dispatch_rate, over real WAL storage."""

import asyncio
import time

import pytest

from danube import message_codec
from danube.broker import TopicPolicies
from danube.broker.ratelimit import PublishGate, TokenBucket
from danube.errors import InvalidArgumentError
from tests.unit.broker.conftest import stop

T = "/default/limited"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batch(texts, producer_id=0):
    return bytearray(message_codec.encode_payloads([t.encode() for t in texts], producer_id=producer_id))


def texts(delivery):
    return [bytes(r.payload).decode() for r in message_codec.iter_records(delivery.frames)]


# ------------------------------------------------------------------ the bucket


def test_bucket_starts_full_refills_at_rate_and_caps_at_burst():
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock)  # burst: one second's worth
    assert bucket.available() == 100
    bucket.take(100)
    assert bucket.available() == 0
    assert bucket.wait_time(1) == pytest.approx(0.01)
    clock.now += 0.25
    assert bucket.available() == 25
    clock.now += 10
    assert bucket.available() == 100  # never more than the burst


def test_reserve_goes_into_debt_and_says_how_long_it_lasts():
    clock = FakeClock()
    bucket = TokenBucket(1000, burst=500, clock=clock)
    assert bucket.reserve(400) == 0.0
    assert bucket.reserve(600) == pytest.approx(0.5)  # 500 short at 1000/s
    assert bucket.available() == 0
    clock.now += 0.5
    assert bucket.available() == 0  # the debt is paid, nothing more
    clock.now += 0.1
    assert bucket.available() == 100


def test_bad_limits_are_refused():
    with pytest.raises(InvalidArgumentError, match="positive"):
        TokenBucket(0)
    with pytest.raises(InvalidArgumentError, match="burst"):
        TokenBucket(10, burst=0.5)


async def test_gate_keeps_delayed_publishes_in_order():
    gate = PublishGate(1000, burst=10)
    order = []

    async def publish(i, count):
        await gate.turn(count)
        order.append(i)

    started = time.monotonic()
    await asyncio.gather(*(publish(i, 20) for i in range(5)))  # 100 messages, 90 over the burst
    assert order == [0, 1, 2, 3, 4]
    assert time.monotonic() - started >= 0.085
    assert gate.throttled == 5


async def test_cancelled_waiter_does_not_block_the_ones_behind_it():
    gate = PublishGate(100, burst=1)
    first = asyncio.ensure_future(gate.turn(10))  # waits ~0.1 s
    await asyncio.sleep(0)
    second = asyncio.ensure_future(gate.turn(1))  # behind it
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.wait_for(second, 1.0)


# ------------------------------------------------------------------ the broker


async def test_publish_over_the_rate_is_delayed_not_refused(make_broker):
    b = await make_broker(policies=TopicPolicies(max_publish_rate=2000))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    started = time.monotonic()
    assert await b.publish(pid, batch([f"a{i}" for i in range(2000)])) == (0, 1999)  # the burst
    assert time.monotonic() - started < 0.4
    results = await asyncio.gather(*(b.publish(pid, batch([f"b{j}.{i}" for i in range(250)])) for j in range(4)))
    elapsed = time.monotonic() - started
    assert elapsed >= 0.45  # 1000 messages over the burst at 2000/s
    assert results == [(2000 + 250 * j, 2249 + 250 * j) for j in range(4)]  # arrival order kept
    got = []
    while len(got) < 3000:
        got += texts(await asyncio.wait_for(b.receive(cid, max_messages=5000, max_bytes=1 << 22), 2))
    assert got[2000:2003] == ["b0.0", "b0.1", "b0.2"] and got[-1] == "b3.249"
    topic = b.topics[T]
    assert topic.publish_gate.throttled >= 1
    await stop(b)


async def test_unlimited_topic_has_no_gate(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    await broker.publish(pid, batch(["x"]))
    assert broker.topics[T].publish_gate is None
    assert broker.topics[T].subscriptions == {} or all(
        s.dispatch_limit is None for s in broker.topics[T].subscriptions.values()
    )


async def test_single_message_publishes_are_limited_too(make_broker):
    b = await make_broker(policies=TopicPolicies(max_publish_rate=100))
    pid = await b.create_producer(T, "p", reliable=True)
    started = time.monotonic()
    offsets = await asyncio.gather(
        *(
            b.publish_one(pid, message_codec.encode_record(f"m{i}".encode(), publish_time=1, producer_id=pid))
            for i in range(120)
        )
    )
    assert offsets == list(range(120))  # in submission order
    assert time.monotonic() - started >= 0.18  # 20 over the burst of 100 at 100/s
    await stop(b)


async def test_dispatch_rate_paces_deliveries(make_broker):
    b = await make_broker(policies=TopicPolicies(max_subscription_dispatch_rate=1000))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch([f"m{i}" for i in range(1500)]))
    started = time.monotonic()
    counts = []
    while sum(counts) < 1500:
        d = await asyncio.wait_for(b.receive(cid, max_messages=5000, max_bytes=1 << 22), 2)
        counts.append(d.count)
        await b.ack_ranges(cid, [(d.first_offset, d.last_offset)])
    elapsed = time.monotonic() - started
    assert counts[0] == 1000  # the burst, then what the rate refills
    assert elapsed >= 0.45  # 500 more at 1000/s
    assert sum(counts) == 1500
    # The limit is per subscription: another one starts with its own full bucket.
    cid2 = await b.subscribe(T, "other", "c2")
    await b.publish(pid, batch(["late"]))
    d = await asyncio.wait_for(b.receive(cid2, max_messages=10, max_bytes=1 << 20), 1)
    assert texts(d) == ["late"]
    await stop(b)


async def test_per_topic_policy_document_sets_the_limits(make_broker):
    b = await make_broker()
    await b.metadata.put_json(
        "/topics/default/limited/policy", {"max_publish_rate": 50, "max_subscription_dispatch_rate": 20}
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    topic = b.topics[T]
    assert topic.publish_gate is not None and topic.publish_gate.bucket.rate == 50
    assert topic.subscriptions["s"].dispatch_limit.rate == 20
    await b.publish(pid, batch([f"m{i}" for i in range(30)]))
    d = await asyncio.wait_for(b.receive(cid, max_messages=100, max_bytes=1 << 20), 1)
    assert d.count == 20  # one second's worth at 20/s
    await stop(b)
