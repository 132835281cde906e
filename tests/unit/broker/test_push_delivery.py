"""Receives that take deliveries by push (``Subscription.receive(push=...)``): a waiting stream is
served from the notify that made messages visible, without its task, and falls back to returning
the delivery whenever the push cannot be made; ordering, credit, redelivery timers and every
subscription type stay as with a plain receive."""

import asyncio

import pytest

from danube import message_codec
from danube.broker import FailurePolicy
from tests.support.waiting import async_wait_until
from tests.unit.broker.conftest import stop
from tests.unit.broker.test_poison_records import raw_frame, store_below_the_check

T = "/default/push"


def batch(*payloads: str, key: str | None = None) -> bytearray:
    return bytearray(message_codec.encode_payloads([p.encode() for p in payloads], key=key))


def texts(buf) -> list[str]:
    return [bytes(r.payload).decode() for r in message_codec.iter_records(buf)]


class Stream:
    """A consumer stream's push callback: writes while it has credit (and is writable)."""

    def __init__(self, messages: int, *, writable: bool = True) -> None:
        self.credit = [messages, 1 << 30]
        self.writable = writable
        self.written: list[tuple[int, int, list[str]]] = []

    def __call__(self, frames, first: int, last: int, count: int):
        if not self.writable:
            return None
        assert count == last - first + 1 == len(texts(frames))  # consecutive offsets, as many frames
        self.written.append((first, last, texts(frames)))
        self.credit[0] -= count
        self.credit[1] -= len(frames)
        return self.credit[0], self.credit[1]

    def payloads(self) -> list[str]:
        return [p for _, _, ps in self.written for p in ps]


def start(broker, cid: int, stream: Stream) -> asyncio.Task:
    return asyncio.ensure_future(
        broker.receive(cid, max_messages=stream.credit[0], max_bytes=stream.credit[1], push=stream)
    )


async def waiting(broker, topic: str, subscription: str, n: int = 1) -> None:
    """Until ``n`` receives of the subscription wait by push."""
    sub = broker.topics[topic].subscriptions[subscription]
    await async_wait_until(lambda: len(sub._push) >= n, 5, f"{n} receive(s) waiting by push")


async def test_a_waiting_stream_is_written_without_its_receive_returning(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
    stream = Stream(8)
    task = start(broker, cid, stream)
    await waiting(broker, T, "s")
    await broker.publish(pid, batch("a", "b"))
    await broker.publish(pid, batch("c", "d"))
    assert stream.written == [(0, 1, ["a", "b"]), (2, 3, ["c", "d"])]  # in the publishing turn
    assert not task.done()
    sub = broker.topics[T].subscriptions["s"]
    assert sub.tracker.unacked == 4 and sub.consumers[cid].messages_out == 4
    # the credit runs out inside a batch: what fits is written, the receive returns empty
    await broker.publish(pid, batch("e", "f", "g", "h", "i"))
    delivery = await asyncio.wait_for(task, 2)
    assert delivery.count == 0
    assert stream.payloads() == list("abcdefgh") and stream.credit[0] == 0
    # the rest waits for the next receive
    rest = await asyncio.wait_for(broker.receive(cid, max_messages=10, max_bytes=1 << 20), 2)
    assert texts(rest.frames) == ["i"] and rest.first_offset == 8


async def test_a_lone_waiting_stream_stays_registered_once_across_pushes_and_acks(broker):
    """The one push receive of a subscription stays in its waiters while it has nothing more to
    take (not taken out and put back per notify): exactly once, whatever the pushes and acks."""
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
    stream = Stream(100)
    task = start(broker, cid, stream)
    await waiting(broker, T, "s")
    sub = broker.topics[T].subscriptions["s"]
    for i in range(5):
        await broker.publish(pid, batch(f"m{i}"))
        assert [c.id for c, _ in sub._waiters] == [cid]
        await broker.ack_ranges(cid, [(i, i)])
        assert [c.id for c, _ in sub._waiters] == [cid] and sub.cursor == i
    assert stream.payloads() == [f"m{i}" for i in range(5)] and not task.done()
    # out of credit: the receive returns empty and leaves the waiters
    stream.credit[0] = 1
    await broker.publish(pid, batch("last"))
    assert (await asyncio.wait_for(task, 2)).count == 0
    assert sub._waiters == []


async def test_a_stream_that_cannot_write_gets_the_delivery_from_its_receive(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
    stream = Stream(10, writable=False)
    task = start(broker, cid, stream)
    await waiting(broker, T, "s")
    await broker.publish(pid, batch("a", "b"))
    delivery = await asyncio.wait_for(task, 2)
    assert (delivery.first_offset, delivery.last_offset, texts(delivery.frames)) == (0, 1, ["a", "b"])
    assert stream.written == []


async def test_a_nack_while_the_stream_waits_is_redelivered_when_due(make_broker):
    broker = await make_broker(failure_policy=FailurePolicy(ack_timeout_ms=30_000, base_redelivery_delay_ms=50))
    try:
        pid = await broker.create_producer(T, "p", reliable=True)
        cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
        stream = Stream(10)
        task = start(broker, cid, stream)
        await waiting(broker, T, "s")
        await broker.publish(pid, batch("a"))
        assert stream.payloads() == ["a"]
        await broker.nack(cid, 0, delay_ms=200)  # due later than any timer the wait armed
        again = await asyncio.wait_for(task, 3)
        assert texts(again.frames) == ["a"] and again.redelivery_counts == {0: 1}
    finally:
        await stop(broker)


async def test_an_unacked_push_delivery_is_redelivered_after_the_ack_timeout(make_broker):
    broker = await make_broker(failure_policy=FailurePolicy(ack_timeout_ms=300, base_redelivery_delay_ms=10))
    try:
        pid = await broker.create_producer(T, "p", reliable=True)
        cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
        stream = Stream(10)
        task = start(broker, cid, stream)
        await waiting(broker, T, "s")  # nothing unacked yet: the wait armed no timer
        await broker.publish(pid, batch("a", "b"))
        assert stream.payloads() == ["a", "b"]
        again = await asyncio.wait_for(task, 3)
        assert texts(again.frames) == ["a", "b"] and again.redelivery_counts == {0: 1, 1: 1}
    finally:
        await stop(broker)


async def test_shared_consumers_waiting_by_push_take_turns(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="shared")
    b = await broker.subscribe(T, "s", "b", sub_type="shared")
    streams = {a: Stream(100), b: Stream(100)}
    tasks = [start(broker, cid, s) for cid, s in streams.items()]
    await waiting(broker, T, "s", 2)
    for i in range(6):
        await broker.publish(pid, batch(f"{i}.0", f"{i}.1"))
    got_a, got_b = streams[a].payloads(), streams[b].payloads()
    assert got_a and got_b  # both served
    assert sorted(got_a + got_b) == sorted(f"{i}.{k}" for i in range(6) for k in range(2))
    assert got_a == sorted(got_a) and got_b == sorted(got_b)
    assert not any(t.done() for t in tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_failover_standby_is_not_pushed_to(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    a = await broker.subscribe(T, "s", "a", sub_type="failover")
    b = await broker.subscribe(T, "s", "b", sub_type="failover")
    sa, sb = Stream(100), Stream(100)
    tasks = [start(broker, a, sa), start(broker, b, sb)]
    await waiting(broker, T, "s", 2)
    await broker.publish(pid, batch("x", "y"))
    assert sa.payloads() == ["x", "y"] and sb.written == []
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_key_shared_takes_the_awaited_path(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c", sub_type="key_shared")
    stream = Stream(10)
    task = start(broker, cid, stream)
    await waiting(broker, T, "s")
    await broker.publish(pid, batch("k1", key="k"))
    delivery = await asyncio.wait_for(task, 2)
    assert texts(delivery.frames) == ["k1"] and stream.written == []


async def test_a_poison_record_met_by_a_push_does_not_stall_the_stream(make_broker):
    broker = await make_broker(failure_policy=FailurePolicy(poison_policy="drop"))
    try:
        await broker.create_producer(T, "p", reliable=True)
        cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
        stream = Stream(10)
        task = start(broker, cid, stream)
        await waiting(broker, T, "s")
        # one notify for both: the push meets the poison record first, then "after" must follow
        store_below_the_check(broker, T, raw_frame(b"\xff\xfe") + message_codec.encode_payloads([b"after"]))
        delivery = await asyncio.wait_for(task, 3)
        assert stream.payloads() + texts(delivery.frames) == ["after"]
        assert delivery.first_offset == 1
    finally:
        await stop(broker)


@pytest.mark.parametrize("reliable", [True, False])
async def test_every_message_arrives_once_in_order_over_many_small_batches(broker, reliable):
    """Push and awaited receives interleaved (credit runs out, the stream comes back): nothing is
    lost or repeated."""
    pid = await broker.create_producer(T, "p", reliable=reliable)
    cid = await broker.subscribe(T, "s", "c", sub_type="exclusive")
    expected = [f"m{i}" for i in range(300)]
    got: list[str] = []
    pushed = [0]

    async def consume():
        while True:
            stream = Stream(7)
            stream.written = written = []  # type: ignore[misc]

            def push(frames, first, last, count, stream=stream, written=written):
                room = stream(frames, first, last, count)
                got.extend(written.pop()[2])
                pushed[0] += 1
                if reliable:
                    broker.topics[T].subscriptions["s"].ack_ranges([(first, last)])
                return room

            d = await broker.receive(cid, max_messages=7, max_bytes=1 << 20, push=push)
            got.extend(texts(d.frames))
            if d.count and reliable:
                await broker.ack(cid, range(d.first_offset, d.last_offset + 1))

    consumer = asyncio.ensure_future(consume())
    try:
        for i in range(0, len(expected), 2):
            await broker.publish(pid, batch(*expected[i : i + 2]))
            if i % 10 == 0:
                await asyncio.sleep(0)
        await async_wait_until(lambda: len(got) >= len(expected), 10, "every message")
    finally:
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
    assert got == expected
    assert pushed[0] > 0  # (most of them were pushed)


async def test_a_push_receive_behind_what_a_non_reliable_topic_holds_skips_to_the_oldest_held(make_broker):
    from danube.broker import DispatchSettings

    broker = await make_broker(dispatch=DispatchSettings(cursor_flush_interval_ms=50, non_reliable_buffer_bytes=1))
    try:
        pid = await broker.create_producer(T, "p", reliable=False)
        cid = await broker.subscribe(T, "s", "c", sub_type="exclusive", reliable=False)
        stream = Stream(2)
        task = start(broker, cid, stream)
        await waiting(broker, T, "s")
        await broker.publish(pid, batch("a", "b"))
        assert (await asyncio.wait_for(task, 2)).count == 0  # out of credit
        for i in range(5):  # the in-memory history keeps only the newest batch
            await broker.publish(pid, batch(f"x{i}"))
        topic = broker.topics[T]
        assert topic.subscriptions["s"].next_read == 2 < topic.first_offset == 6
        more = Stream(100)
        delivery = await asyncio.wait_for(start(broker, cid, more), 2)
        assert (delivery.first_offset, texts(delivery.frames)) == (6, ["x4"])
        assert more.written == []  # (taken by the awaited read, which skipped what was lost)
    finally:
        await stop(broker)
