"""BrokerService over real local storage and the embedded metadata store."""

import asyncio

import pytest

from danube import message_codec
from danube.broker import FailurePolicy, TopicPolicies
from danube.errors import (
    AlreadyExistsError,
    CorruptFrameError,
    InvalidArgumentError,
    InvalidTopicNameError,
    MessageTooLargeError,
    NotFoundError,
    PolicyViolationError,
)
from tests.unit.broker.conftest import stop

T = "/default/topic"


def batch(payloads, key=None, producer_id=0):
    return bytearray(
        message_codec.encode_payloads(
            [p if isinstance(p, bytes) else p.encode() for p in payloads], key=key, producer_id=producer_id
        )
    )


def payloads(delivery):
    return [bytes(r.payload).decode() for r in message_codec.iter_records(delivery.frames)]


async def receive(broker, cid, n=100, timeout=2.0):
    return await asyncio.wait_for(broker.receive(cid, max_messages=n, max_bytes=1 << 20), timeout)


async def test_publish_receive_ack_and_resume_after_restart(make_broker):
    b = await make_broker()
    pid = await b.create_producer(T, "p", reliable=True)
    assert await b.create_producer(T, "p", reliable=True) == pid  # same name, same id
    cid = await b.subscribe(T, "s", "c")
    assert await b.publish(pid, batch(["a", "b", "c", "d"])) == (0, 3)
    d = await receive(b, cid)
    assert (d.first_offset, d.last_offset, d.count) == (0, 3, 4)
    assert payloads(d) == ["a", "b", "c", "d"]
    await b.ack(cid, [1, 0])  # out of order; 2 and 3 stay unacked
    await stop(b)

    b = await make_broker()
    assert await b.publish(pid, batch(["e"])) == (4, 4)  # the producer id survived the restart
    d = await receive(b, cid)  # and so did the consumer's, resuming at cursor + 1
    assert payloads(d) == ["c", "d", "e"]
    await stop(b)


async def test_new_subscription_starts_at_latest(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    await broker.publish(pid, batch(["old"]))
    cid = await broker.subscribe(T, "late", "c")
    await broker.publish(pid, batch(["new"]))
    assert payloads(await receive(broker, cid)) == ["new"]


@pytest.mark.parametrize("reliable", [True, False])
async def test_new_subscription_from_earliest_starts_at_the_oldest_message(broker, reliable):
    topic = f"{T}-{'r' if reliable else 'n'}"
    pid = await broker.create_producer(topic, "p", reliable=reliable)
    await broker.publish(pid, batch(["old-1", "old-2"]))
    cid = await broker.subscribe(topic, "replay", "c", reliable=reliable, initial_position="earliest")
    assert payloads(await receive(broker, cid)) == ["old-1", "old-2"]
    await broker.ack(cid, [0, 1])
    # an existing subscription keeps its cursor, whatever position a consumer asks for
    await broker.publish(pid, batch(["new"]))
    again = await broker.subscribe(topic, "replay", "c", reliable=reliable, initial_position="earliest")
    assert payloads(await receive(broker, again)) == ["new"]
    with pytest.raises(InvalidArgumentError, match="initial position"):
        await broker.subscribe(topic, "x", "c", initial_position="oldest")


async def test_second_exclusive_consumer_is_rejected(broker):
    await broker.create_producer(T, "p", reliable=True)
    await broker.subscribe(T, "s", "c1")
    with pytest.raises(AlreadyExistsError, match="exclusive.*'c1'"):
        await broker.subscribe(T, "s", "c2")
    with pytest.raises(InvalidArgumentError, match="is exclusive"):
        await broker.subscribe(T, "s", "c3", sub_type="shared")


async def test_shared_consumers_take_turns(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="shared")
    b = await broker.subscribe(T, "s", "b", sub_type="shared")
    ta = asyncio.create_task(receive(broker, a))
    tb = asyncio.create_task(receive(broker, b))
    await asyncio.sleep(0.05)
    await broker.publish(pid, batch(["1"]))
    await broker.publish(pid, batch(["2"]))
    got = sorted(payloads(await ta) + payloads(await tb))
    assert got == ["1", "2"]


async def test_shared_consumers_take_turns_when_they_come_straight_back(broker):
    # Each consumer asks again the moment it is served, with nothing in between that yields to
    # the loop (as a stream whose writes complete at once does): turns must still alternate.
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="shared")
    b = await broker.subscribe(T, "s", "b", sub_type="shared")
    got: dict[int, list[str]] = {a: [], b: []}

    async def consume(cid):
        while sum(len(v) for v in got.values()) < 20:
            got[cid] += payloads(await broker.receive(cid, max_messages=100, max_bytes=1 << 20))

    tasks = [asyncio.create_task(consume(cid)) for cid in (a, b)]
    await asyncio.sleep(0.05)
    for i in range(20):
        await broker.publish(pid, batch([str(i)]))
        await asyncio.sleep(0.005)
    await asyncio.wait(tasks, timeout=2)
    for t in tasks:
        t.cancel()
    assert sorted(got[a] + got[b], key=int) == [str(i) for i in range(20)]
    assert len(got[a]) == len(got[b]) == 10, got


async def test_failover_standby_gets_unacked_when_active_leaves(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    active = await broker.subscribe(T, "s", "active", sub_type="failover")
    standby = await broker.subscribe(T, "s", "standby", sub_type="failover")
    waiting = asyncio.create_task(receive(broker, standby, timeout=5))
    await broker.publish(pid, batch(["x", "y"]))
    d = await receive(broker, active)
    assert payloads(d) == ["x", "y"] and not waiting.done()
    await broker.ack(active, [d.first_offset])
    broker.detach(active)
    assert payloads(await waiting) == ["y"]


async def test_key_shared_routes_keys_and_honours_filters(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    eu = await broker.subscribe(T, "s", "eu", sub_type="key_shared", key_filters=["eu-*"])
    us = await broker.subscribe(T, "s", "us", sub_type="key_shared", key_filters=["us-*"])
    await broker.publish(pid, batch(["1"], key="eu-west"))
    await broker.publish(pid, batch(["2"], key="us-east"))
    await broker.publish(pid, batch(["3"], key="eu-north"))
    got_eu = payloads(await receive(broker, eu))
    got_us = payloads(await receive(broker, us))
    assert got_eu == ["1", "3"] and got_us == ["2"]


async def test_key_shared_same_key_same_consumer(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cids = [await broker.subscribe(T, "s", f"c{i}", sub_type="key_shared") for i in range(3)]
    for i in range(30):
        await broker.publish(pid, batch([f"{i}"], key=f"k{i % 5}"))
    seen = {}
    for cid in cids:
        try:
            while True:
                d = await receive(broker, cid, timeout=0.3)
                for r in message_codec.iter_records(d.frames):
                    assert seen.setdefault(r.routing_key, cid) == cid
        except asyncio.TimeoutError:
            pass
    assert len(seen) == 5


async def test_nack_redelivers_after_the_larger_delay(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch(["a"]))
    d = await receive(broker, cid)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await broker.nack(cid, d.first_offset, delay_ms=300)
    again = await receive(broker, cid)
    assert loop.time() - start >= 0.28
    assert payloads(again) == ["a"] and again.redelivery_counts == {0: 1}


async def test_ack_timeout_redelivers_then_poison_drop(make_broker):
    b = await make_broker(
        failure_policy=FailurePolicy(
            ack_timeout_ms=100,
            base_redelivery_delay_ms=10,
            max_redelivery_delay_ms=20,
            max_redelivery_count=2,
            poison_policy="drop",
        )
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["poison"]))
    counts = [(await receive(b, cid)).redelivery_counts.get(0, 0) for _ in range(3)]
    assert counts == [0, 1, 2]
    await b.publish(pid, batch(["next"]))
    assert payloads(await receive(b, cid)) == ["next"]  # dropped after 2 redeliveries
    await asyncio.sleep(0.15)
    await b.ack(cid, [1])
    assert b.topics[T].subscriptions["s"].cursor == 1
    await stop(b)


async def test_poison_dead_letter_topic(make_broker):
    b = await make_broker(
        failure_policy=FailurePolicy(
            ack_timeout_ms=60_000,
            base_redelivery_delay_ms=10,
            max_redelivery_delay_ms=20,
            max_redelivery_count=1,
            poison_policy="dead_letter",
            dead_letter_topic="/default/dlq",
        )
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["bad"]))
    for _ in range(2):
        d = await receive(b, cid)
        await b.nack(cid, d.first_offset)
    for _ in range(50):
        if "/default/dlq" in b.topics and b.topics["/default/dlq"].storage.next_offset == 1:
            break
        await asyncio.sleep(0.02)
    rec = message_codec.decode_batch(await b.topics["/default/dlq"].storage.read_frames(0, 1 << 20))[0]
    assert bytes(rec.payload) == b"bad" and rec.attributes["x-original-topic"] == T
    await stop(b)


async def test_poison_block_stops_the_subscription(make_broker):
    b = await make_broker(
        failure_policy=FailurePolicy(base_redelivery_delay_ms=10, max_redelivery_delay_ms=20, max_redelivery_count=1)
    )
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    await b.publish(pid, batch(["bad"]))
    for _ in range(2):
        d = await receive(b, cid)
        await b.nack(cid, d.first_offset)
    await b.publish(pid, batch(["after"]))
    with pytest.raises(asyncio.TimeoutError):
        await receive(b, cid, timeout=0.3)
    assert b.topics[T].subscriptions["s"].unblock() == 1
    assert payloads(await receive(b, cid)) == ["after"]
    await stop(b)


async def test_non_reliable_is_at_most_once(broker):
    pid = await broker.create_producer(T, "p", reliable=False)
    await broker.publish(pid, batch(["before"]))
    cid = await broker.subscribe(T, "s", "c", reliable=False)
    await broker.publish(pid, batch(["a", "b"]))
    d = await receive(broker, cid)
    assert payloads(d) == ["a", "b"]
    await broker.nack(cid, d.first_offset)  # no redelivery on a non-reliable topic
    with pytest.raises(asyncio.TimeoutError):
        await receive(broker, cid, timeout=0.2)


async def test_bad_input_is_rejected_and_data_stays_intact(make_broker):
    b = await make_broker(policies=TopicPolicies(max_message_size=100, max_producers_per_topic=1))
    pid = await b.create_producer(T, "p", reliable=True)
    cid = await b.subscribe(T, "s", "c")
    with pytest.raises(PolicyViolationError, match="max_producers_per_topic"):
        await b.create_producer(T, "other", reliable=True)
    with pytest.raises(MessageTooLargeError, match="max_message_size"):
        await b.publish(pid, batch(["ok", "x" * 101]))
    corrupt = batch(["hello"])
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptFrameError):
        await b.publish(pid, corrupt)
    with pytest.raises(InvalidArgumentError, match="empty"):
        await b.publish(pid, bytearray())
    with pytest.raises(NotFoundError, match="unknown producer id"):
        await b.publish(424242, batch(["x"]))
    with pytest.raises(NotFoundError, match="unknown consumer id"):
        await b.ack(424242, [0])
    with pytest.raises(InvalidTopicNameError):
        await b.create_producer("bad name", "p")
    with pytest.raises(NotFoundError, match="does not exist"):
        await b.subscribe("/default/nothing", "s", "c", reliable=None)
    with pytest.raises(InvalidArgumentError, match="reliable"):
        await b.create_producer(T, "p", reliable=False)
    assert await b.publish(pid, batch(["fine"])) == (0, 0)
    assert payloads(await receive(b, cid)) == ["fine"]
    await stop(b)


async def test_partitions_are_recorded(broker):
    for i in (0, 2, 1):
        await broker.create_producer(f"{T}-part-{i}", f"p-{i}", reliable=True)
    assert await broker.partitions(T) == [f"{T}-part-{i}" for i in range(3)]
    assert await broker.partitions("/default/plain") == ["/default/plain"]


async def test_unload_closes_clients_and_topic_resumes(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch(["a", "b"]))
    await receive(broker, cid)
    await broker.ack(cid, [0])
    assert broker.health("producer", pid) and broker.health("consumer", cid)
    last = await broker.unload_topic(T)
    assert last == 1
    assert not broker.health("producer", pid) and not broker.health("consumer", cid)
    assert T not in broker.topics
    pid2 = await broker.create_producer(T, "p", reliable=True)
    assert await broker.publish(pid2, batch(["c"])) == (2, 2)
    cid2 = await broker.subscribe(T, "s", "c")
    got = payloads(await receive(broker, cid2))
    if len(got) < 2:  # the sealed history and the new WAL may come in separate deliveries
        got += payloads(await receive(broker, cid2))
    assert got == ["b", "c"]


async def test_cursor_is_persisted_debounced(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    await broker.publish(pid, batch(["a", "b", "c"]))
    await receive(broker, cid)
    await broker.ack(cid, range(0, 3))
    from danube.metadata import keys

    for _ in range(40):
        if await broker.metadata.get_json(keys.subscription_cursor(T, "s")) == 2:
            break
        await asyncio.sleep(0.025)
    assert await broker.metadata.get_json(keys.subscription_cursor(T, "s")) == 2
