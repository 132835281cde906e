"""Many consumers read together: what arrived in one loop turn comes in one receive (each consumer
once, in arrival order), nothing is lost or repeated, credit goes back as with receive_batch, and
closed or failed consumers are handled without taking the others down."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client.connection import RetryPolicy
from danube.client.consumer import Consumer
from danube.client.consumer_set import ConsumerSet
from danube.client.consumer_stream import PartitionConsumer
from danube.client.messages import MessageBatch
from danube.errors import ClientError
from danube.proto.danube_batch import batch_pb2 as pb


def _consumer(name: str, **kwargs) -> Consumer:
    return Consumer(SimpleNamespace(retry=RetryPolicy()), f"/default/{name}", name, "s", **kwargs)


def _batch(first: int, count: int = 1, partition: int = 0) -> MessageBatch:
    return MessageBatch("t", partition, b"x" * count, first, first + count - 1, count)


async def test_what_arrives_in_one_loop_turn_comes_in_one_receive():
    a, b, c = _consumer("a"), _consumer("b"), _consumer("c")
    group = ConsumerSet([a, b, c])
    reader = asyncio.ensure_future(group.receive())
    await asyncio.sleep(0)
    assert not reader.done()
    a1, b1, a2 = _batch(0), _batch(0), _batch(1)
    a.deliver(a1)
    b.deliver(b1)
    a.deliver(a2)
    assert await asyncio.wait_for(reader, 5) == [(a, [a1, a2]), (b, [b1])]
    assert await group.receive(timeout=0) == []


async def test_a_receive_without_deliveries_times_out_empty():
    group = ConsumerSet([_consumer("a")])
    assert await group.receive(timeout=0.01) == []


async def test_batches_delivered_before_the_set_was_made_are_found():
    a = _consumer("a")
    early = _batch(0)
    a.deliver(early)
    assert await ConsumerSet([a]).receive(timeout=0) == [(a, [early])]


async def test_a_consumer_belongs_to_one_set_at_a_time():
    a = _consumer("a")
    group = ConsumerSet([a])
    with pytest.raises(ValueError, match="already belongs"):
        ConsumerSet([a])
    group.close()
    ConsumerSet([a])  # free again


async def test_a_closed_consumer_leaves_the_set():
    a, b = _consumer("a"), _consumer("b")
    group = ConsumerSet([a, b])
    await a.close()
    b1 = _batch(0)
    b.deliver(b1)
    assert await group.receive(timeout=1) == [(b, [b1])]
    assert len(group) == 1
    await b.close()
    assert await asyncio.wait_for(group.receive(), 5) == []  # every consumer closed: nothing to wait for


async def test_a_failed_consumer_raises_after_the_others_batches_until_removed():
    a, b = _consumer("a"), _consumer("b")
    group = ConsumerSet([a, b])
    a1 = _batch(0)
    a.deliver(a1)
    b.deliver_error(ClientError("gave up"))
    assert await group.receive(timeout=1) == [(a, [a1])]
    with pytest.raises(ClientError, match="gave up"):
        await group.receive(timeout=1)
    with pytest.raises(ClientError, match="gave up"):  # still there
        await group.receive(timeout=1)
    group.remove(b)
    a2 = _batch(1)
    a.deliver(a2)
    assert await group.receive(timeout=1) == [(a, [a2])]


async def test_credit_goes_back_at_the_next_receive_of_the_set():
    a = _consumer("a", receive_messages=10, receive_bytes=1 << 20)
    part = PartitionConsumer(a, 0, a.topic)
    a._parts = [part]
    group = ConsumerSet([a])
    a.deliver(_batch(0, 2))
    await group.receive(timeout=0)
    assert part.owed == [0, 0]  # the application is still working on it
    a.deliver(_batch(2, 3))
    await group.receive(timeout=0)
    assert part.owed == [2, 2]  # the first batch is done: its credit is owed back
    assert len(part._outbox) == 0
    a.deliver(_batch(5, 1))
    await group.receive(timeout=0)
    # five of ten messages owed: half the window, sent as one grant
    assert part.owed == [0, 0]
    assert [r.credit.messages for r in part._outbox._items] == [5]
    # the next receive finds nothing of this consumer: the batch taken before is done all the same
    assert await group.receive(timeout=0) == []
    assert part.owed == [1, 1]


async def test_a_reader_that_took_the_whole_window_at_once_gets_it_back_before_waiting():
    """A slow reader finds the whole receive window in its inbox and takes it in one receive: the
    broker has no credit left, so nothing arrives until the set's next receive gives it back."""
    a = _consumer("a", receive_messages=10, receive_bytes=1 << 20)
    part = PartitionConsumer(a, 0, a.topic)
    a._parts = [part]
    group = ConsumerSet([a])
    for first in range(0, 10, 2):
        a.deliver(_batch(first, 2))
    ((_, batches),) = await group.receive(timeout=0)
    assert sum(b.count for b in batches) == 10
    assert len(part._outbox) == 0  # held while the application works on them
    assert await group.receive(timeout=0.01) == []  # waits for more
    assert [r.credit.messages for r in part._outbox._items] == [10]


async def test_a_redelivery_of_what_was_acked_is_dropped_and_acked_again():
    a = _consumer("a")
    part = PartitionConsumer(a, 0, a.topic)
    a._parts = [part]
    group = ConsumerSet([a])
    part.ack_range(0, 1)
    a.deliver(_batch(0, 2))
    assert await group.receive(timeout=0.01) == []
    fresh = _batch(2, 1)
    a.deliver(fresh)
    assert await group.receive(timeout=0) == [(a, [fresh])]
    (run,) = part._outbox._items
    assert run.ranges == [[0, 1], [0, 1]]  # the dropped ones were acked again


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 3), st.just("receive")), max_size=40))
def test_every_batch_is_received_once_in_delivery_order(ops):
    """Deliveries to four consumers interleaved with receives: each receive names a consumer at
    most once, in the order they first had something; every batch comes exactly once, in order."""

    async def run() -> None:
        consumers = [_consumer(f"c{i}") for i in range(4)]
        group = ConsumerSet(consumers)
        delivered: dict[int, list[MessageBatch]] = {i: [] for i in range(4)}
        received: dict[int, list[MessageBatch]] = {i: [] for i in range(4)}
        arrival: list[int] = []  # consumers with batches since the last receive, first arrival first
        for op in ops + ["receive"]:
            if op == "receive":
                got = await group.receive(timeout=0)
                assert [consumers.index(c) for c, _ in got] == arrival
                for consumer, batches in got:
                    received[consumers.index(consumer)].extend(batches)
                arrival = []
            else:
                batch = _batch(len(delivered[op]))
                delivered[op].append(batch)
                consumers[op].deliver(batch)
                if op not in arrival:
                    arrival.append(op)
        assert received == delivered

    asyncio.run(run())


class _CreditModel:
    """The broker's side of one consumer's credit: it delivers only within the credit the stream
    has, and takes back what the consumer's outbox grants."""

    def __init__(self, consumer: Consumer, part: PartitionConsumer) -> None:
        self.consumer, self.part = consumer, part
        self.credit = consumer.receive_messages
        self.next_offset = 0

    def collect_grants(self) -> None:
        outbox = self.part._outbox
        kept: deque = deque()
        for item in outbox._items:
            if isinstance(item, pb.ConsumeRequest) and item.HasField("credit"):
                self.credit += item.credit.messages
            else:
                kept.append(item)
        outbox._items = kept

    def deliver(self, count: int) -> None:
        count = min(count, self.credit)
        if count:
            self.consumer.deliver(_batch(self.next_offset, count))
            self.next_offset += count
            self.credit -= count


@settings(max_examples=150, deadline=None)
@given(
    window=st.integers(1, 12),
    ops=st.lists(st.one_of(st.integers(1, 12), st.just("receive")), max_size=40),
)
def test_a_set_that_waits_with_nothing_delivered_never_leaves_the_broker_without_credit(window, ops):
    """Deliveries (each within the broker's credit) interleaved with receives that take and ack
    everything: whenever a receive finds nothing to take (the reader waits), the credit the
    broker holds is positive, so a delivery can still come (else the reader waits forever); it
    never exceeds the window."""

    async def run() -> None:
        consumer = _consumer("a", receive_messages=window, receive_bytes=1 << 20)
        part = PartitionConsumer(consumer, 0, consumer.topic)
        consumer._parts = [part]
        group = ConsumerSet([consumer])
        broker = _CreditModel(consumer, part)
        for op in ops + ["receive", "receive"]:
            if op == "receive":
                got = await group.receive(timeout=0)
                for member, batches in got:
                    for batch in batches:
                        await member.ack_batch(batch)
                broker.collect_grants()
                assert broker.credit <= window  # no batch's credit went back twice
                if not got:
                    assert broker.credit > 0, "the reader waits for a delivery the broker cannot send"
            else:
                broker.deliver(op)

    asyncio.run(run())
