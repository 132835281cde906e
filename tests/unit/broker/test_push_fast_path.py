"""The push fast path (``PushDelivery._push_fresh``: one consumer, fresh frames handed to its
stream inline) delivers exactly what the general path (``_push_one``: the dispatcher's fetch)
does: the same frames in the same order, with the same credit, unacked window, cursor, counts
and redeliveries, whatever happens between publishes (acks, nacks, undecodable records, a
stream that cannot write, credit running out), for every type it serves."""

from __future__ import annotations

import asyncio
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from danube import message_codec
from danube.broker import DispatchSettings, FailurePolicy, TopicPolicies
from danube.broker.delivery import Delivery
from danube.broker.keyshared import KeyFilter
from danube.broker.memory_storage import MemoryTopicStorage
from danube.broker.stats import MetricsSink
from danube.broker.subscription import Consumer, Subscription
from danube.broker.topic import Topic
from tests.unit.broker.test_poison_records import raw_frame

T = "/default/fast"


class CountingSink(MetricsSink):
    """The server's way: counts kept in a list the subscription adds to."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}

    def subscription_counts(self, topic: str, subscription: str) -> list[int]:
        return self.rows.setdefault(subscription, [0, 0, 0])


class CallingSink(MetricsSink):
    """A sink called once per delivery and ack (no list of counts)."""

    def __init__(self) -> None:
        self.row = [0, 0, 0]

    def delivered(self, topic: str, subscription: str, count: int, nbytes: int) -> None:
        self.row[0] += count
        self.row[1] += nbytes

    def acked(self, topic: str, subscription: str, count: int) -> None:
        self.row[2] += count


def texts(frames) -> list[str]:
    return [bytes(r.payload).decode() for r in message_codec.iter_records(frames)]


class Stream:
    """A consumer stream: pushes written while it is writable and has credit; a receive that
    returns (credit gone, a delivery it must write itself, a redelivery) is noted and started
    again with fresh credit."""

    def __init__(self, credit: int) -> None:
        self.credit_size = credit
        self.credit = credit
        self.writable = True
        self.log: list[tuple] = []

    def push(self, frames, first: int, last: int, count: int):
        if not self.writable:
            return None
        self.log.append(("pushed", first, last, count, texts(frames)))
        self.credit -= count
        return self.credit, 1 << 30


async def play(
    ops, *, sub_type: str, reliable: bool, window: int, credit: int, fast: bool, calling: bool, data_dir=None
):
    """``data_dir``: the topic's storage is the broker's own (a WAL whose cache the fast path
    reads), not the in-memory one."""
    if data_dir is None:
        return await _play(
            ops, MemoryTopicStorage(T, max_bytes=1 << 30), sub_type, reliable, window, credit, fast, calling
        )
    from danube.metadata.embedded import EmbeddedMetadataStore
    from danube.storage.config import StorageConfig
    from danube.storage.factory import StorageFactory

    metadata = EmbeddedMetadataStore(os.path.join(data_dir, "metadata.db"))
    factory = StorageFactory(
        StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=data_dir), metadata, broker_id="t"
    )
    try:
        storage = await factory.open_topic(T)
        return await _play(ops, storage, sub_type, reliable, window, credit, fast, calling)
    finally:
        await factory.close()
        await metadata.close()


async def _play(ops, storage, sub_type, reliable, window, credit, fast, calling):
    sink = CallingSink() if calling else CountingSink()
    topic = Topic(T, reliable=reliable, storage=storage, policies=TopicPolicies(), metrics=sink)
    sub = Subscription(
        topic,
        "s",
        sub_type,
        cursor=-1,
        failure_policy=FailurePolicy(ack_timeout_ms=600_000, base_redelivery_delay_ms=0, poison_policy="drop"),
        settings=DispatchSettings(max_unacked_messages=window),
        metrics=sink,
    )
    topic.subscriptions["s"] = sub
    if not fast:
        sub._push_fresh = lambda consumer, waiter, entry: None  # type: ignore[method-assign]
    consumer = Consumer(1, "c", sub, KeyFilter())
    sub.add_consumer(consumer)
    stream = Stream(credit)
    pushed_fast = [0]
    if fast:
        general = sub._push_fresh

        def counted(*args):
            outcome = general(*args)
            pushed_fast[0] += outcome is not None
            return outcome

        sub._push_fresh = counted  # type: ignore[method-assign]

    async def receiving() -> None:
        while True:
            stream.credit = stream.credit_size
            d: Delivery = await sub.receive(consumer, stream.credit, 1 << 30, push=stream.push)
            stream.log.append(("returned", d.first_offset, d.last_offset, d.count, texts(d.frames)))

    task = asyncio.ensure_future(receiving())
    delivered: list[tuple[int, int]] = []  # (first, last) of what was delivered, for the acks
    seen = 0  # entries of the stream's log looked at
    n = 0

    async def settle() -> None:
        for _ in range(6):
            await asyncio.sleep(0)

    await settle()
    for op, arg in ops:
        if op == "publish":
            payloads = [f"m{n + i}".encode() for i in range(arg)]
            n += arg
            buf = bytearray(message_codec.encode_payloads(payloads))
            if arg == 3:  # an undecodable record in the middle: the failure policy takes it
                buf = bytearray(message_codec.encode_payloads(payloads[:1]) + raw_frame(b"\xff\xfe") + buf[:0])
            first, last = topic.append(buf)
            topic.made_visible(last - first + 1, len(buf), last)
        elif op == "ack" and delivered:
            first, last = delivered.pop(arg % len(delivered))
            sub.ack_ranges([(first, last)])
        elif op == "ack_part" and delivered:
            first, _last = delivered[arg % len(delivered)]
            sub.ack_ranges([(first, first)])
        elif op == "nack" and delivered:
            first, _last = delivered[arg % len(delivered)]
            sub.nack(first)
        elif op == "writable":
            stream.writable = not stream.writable
        await settle()
        for entry in stream.log[seen:]:
            if entry[3]:
                delivered.append((entry[1], entry[2]))
        seen = len(stream.log)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    tracker = sub.tracker
    row = sink.row if calling else sink.rows["s"]
    state = (
        stream.log,
        sub.next_read,
        tracker.cursor,
        tracker.unacked,
        sorted(tracker._runs),
        consumer.messages_out,
        consumer.bytes_out,
        list(row),
    )
    return state, pushed_fast[0]


OPS = st.lists(
    st.tuples(
        st.sampled_from(["publish", "publish", "publish", "ack", "ack", "ack_part", "nack", "writable"]),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(
    ops=OPS,
    sub_type=st.sampled_from(["exclusive", "failover", "shared"]),
    reliable=st.booleans(),
    window=st.integers(1, 8),
    credit=st.integers(1, 9),
    calling=st.booleans(),
)
def test_the_fast_path_delivers_what_the_general_path_does(ops, sub_type, reliable, window, credit, calling):
    kw = dict(sub_type=sub_type, reliable=reliable, window=window, credit=credit, calling=calling)
    slow, _ = asyncio.run(play(ops, fast=False, **kw))
    fast, _ = asyncio.run(play(ops, fast=True, **kw))
    assert fast == slow


@settings(max_examples=15, deadline=None)
@given(ops=OPS, sub_type=st.sampled_from(["exclusive", "shared"]), window=st.integers(1, 8), credit=st.integers(1, 9))
def test_the_fast_path_over_the_wal_cache_delivers_what_the_general_path_does(ops, sub_type, window, credit):
    kw = dict(sub_type=sub_type, reliable=True, window=window, credit=credit, calling=False)
    with tempfile.TemporaryDirectory() as slow_dir, tempfile.TemporaryDirectory() as fast_dir:
        slow, _ = asyncio.run(play(ops, fast=False, data_dir=slow_dir, **kw))
        fast, _ = asyncio.run(play(ops, fast=True, data_dir=fast_dir, **kw))
    assert fast == slow


def test_the_fast_path_over_the_wal_cache_takes_each_small_batch_in_turn():
    ops = [("publish", 2), ("ack", 0), ("publish", 1), ("publish", 3), ("publish", 2), ("ack", 0), ("ack", 0)]
    kw = dict(sub_type="exclusive", reliable=True, window=100, credit=100, calling=False)
    with tempfile.TemporaryDirectory() as data_dir:
        (log, next_read, *_rest), fast = asyncio.run(play(ops, fast=True, data_dir=data_dir, **kw))
    # every delivery but the one holding an undecodable record (the general path's: it drops it)
    assert fast == 3
    assert [e[4] for e in log] == [["m0", "m1"], ["m2"], ["m3"], ["m6", "m7"]]
    assert next_read == 7  # (the 3-message publish stored 2 frames: m3 and the undecodable one)


def test_the_fast_path_serves_one_consumer_taking_each_small_batch_in_turn():
    ops = [("publish", 2), ("ack", 0), ("publish", 1), ("publish", 2), ("ack", 0), ("ack", 0)]
    for sub_type in ("exclusive", "failover", "shared"):
        kw = dict(sub_type=sub_type, reliable=True, window=100, credit=100, calling=False)
        (log, next_read, cursor, unacked, runs, messages, _b, row), fast = asyncio.run(play(ops, fast=True, **kw))
        assert fast == 3  # every delivery took it
        assert [e[:4] for e in log] == [("pushed", 0, 1, 2), ("pushed", 2, 2, 1), ("pushed", 3, 4, 2)]
        assert (next_read, cursor, unacked, runs, messages) == (5, 4, 0, [], 5)
        assert row[0] == 5 and row[2] == 5
