"""Single-message publishes (Danube's SendMessage) coalesced into batches, over real WAL storage."""

import asyncio
import contextlib

import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings, TopicPolicies
from danube.errors import MessageTooLargeError, NotFoundError, TopicSealedError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from tests.support.waiting import async_wait_until

T = "/default/coalesced"


@pytest.fixture(params=["always", "interval"])
async def broker(request, tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": request.param}}, data_dir=str(tmp_path))
    factory = StorageFactory(config, metadata, broker_id="test")
    b = BrokerService(
        metadata,
        factory,
        dispatch=DispatchSettings(cursor_flush_interval_ms=50),
        policies=TopicPolicies(max_message_size=1000),
    )
    await b.start()
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await metadata.close()


def frame(text: str, producer_id: int, key: str | None = None) -> bytes:
    return message_codec.encode_record(text.encode(), publish_time=1, producer_id=producer_id, key=key)


async def read_all(broker, cid, count, timeout=5.0):
    got = []
    while len(got) < count:
        d = await asyncio.wait_for(broker.receive(cid, max_messages=1000, max_bytes=1 << 20), timeout)
        got += [(r.offset, r.producer_id, bytes(r.payload).decode()) for r in message_codec.iter_records(d.frames)]
    return got


async def test_concurrent_calls_share_appends_and_durability_waits(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    topic = broker.topics[T]
    offsets = await asyncio.gather(*(broker.publish_one(pid, frame(f"m{i}", pid)) for i in range(200)))
    # submission order is offset order, every call got its own offset
    assert offsets == list(range(200))
    coalescer = topic.coalescer
    assert coalescer.messages == 200
    assert coalescer.batches < 20  # one append per loop iteration, not one per call
    assert coalescer.durability_waits <= coalescer.batches
    assert topic.storage.wal.durable_offset >= 199  # answered only once durable
    got = await read_all(broker, cid, 200)
    assert [p for _o, _pid, p in got] == [f"m{i}" for i in range(200)]
    assert broker._producers[pid].messages_in == 200


async def test_calls_held_during_a_wait_become_one_batch(broker, monkeypatch):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    # The first wait is held open until the later calls are queued: on a loaded machine a real
    # interval syncer can finish it within the few loop turns below, and the later calls would
    # then be batches of their own.
    release = asyncio.Event()
    real_wait = topic.storage.wait_durable

    async def held_first_wait(offset: int) -> None:
        await release.wait()
        await real_wait(offset)

    monkeypatch.setattr(topic.storage, "wait_durable", held_first_wait)
    first = [asyncio.ensure_future(broker.publish_one(pid, frame(f"a{i}", pid))) for i in range(10)]
    await asyncio.sleep(0)  # the first calls are appended as one batch; its wait starts
    await asyncio.sleep(0)
    c = topic.coalescer
    assert (c.batches, c.messages) == (1, 10)
    second = [asyncio.ensure_future(broker.publish_one(pid, frame(f"b{i}", pid))) for i in range(10)]
    await asyncio.sleep(0)
    third = [asyncio.ensure_future(broker.publish_one(pid, frame(f"c{i}", pid))) for i in range(10)]
    await asyncio.sleep(0)
    assert c.batches == 1  # held while the first batch's durability wait runs
    release.set()
    offsets = await asyncio.gather(*first, *second, *third)
    assert offsets == list(range(30))
    # everything held became one batch, with one append and one more durability wait
    assert (c.batches, c.messages, c.durability_waits) == (2, 30, 2)


async def test_held_calls_past_the_limit_are_appended_anyway(broker, monkeypatch):
    from danube.broker import coalesce

    monkeypatch.setattr(coalesce, "MAX_HELD_MESSAGES", 5)
    pid = await broker.create_producer(T, "p", reliable=True)
    c = broker.topics[T].coalescer
    first = asyncio.ensure_future(broker.publish_one(pid, frame("a", pid)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert c.batches == 1
    more = [asyncio.ensure_future(broker.publish_one(pid, frame(f"b{i}", pid))) for i in range(5)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert c.batches == 2  # the limit was reached: appended without waiting for the first wait
    assert await asyncio.gather(first, *more) == list(range(6))


async def test_order_kept_per_producer_when_producers_interleave(broker):
    p1 = await broker.create_producer(T, "p1", reliable=True)
    p2 = await broker.create_producer(T, "p2", reliable=True)
    cid = await broker.subscribe(T, "s", "c")

    async def send(pid, name, n):
        for i in range(n):
            await broker.publish_one(pid, frame(f"{name}-{i}", pid))

    async def burst(pid, name, n):
        return await asyncio.gather(*(broker.publish_one(pid, frame(f"{name}-{i}", pid)) for i in range(n)))

    await asyncio.gather(send(p1, "x", 30), burst(p2, "y", 50))
    got = await read_all(broker, cid, 80)
    for pid, name, n in ((p1, "x", 30), (p2, "y", 50)):
        mine = [p for _o, producer, p in got if producer == pid]
        assert mine == [f"{name}-{i}" for i in range(n)]
    assert [o for o, _p, _m in got] == list(range(80))


async def test_too_large_message_fails_alone(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    calls = [
        broker.publish_one(pid, frame("ok-1", pid)),
        broker.publish_one(pid, frame("x" * 2000, pid)),
        broker.publish_one(pid, frame("ok-2", pid)),
    ]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == 0 and results[2] == 1
    assert isinstance(results[1], MessageTooLargeError)
    assert [p for _o, _pid, p in await read_all(broker, cid, 2)] == ["ok-1", "ok-2"]


async def test_unknown_producer_is_not_found(broker):
    with pytest.raises(NotFoundError):
        await broker.publish_one(12345, frame("m", 12345))


async def test_sealed_topic_fails_every_call_of_the_batch_and_stores_nothing(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    before = topic.storage.next_offset
    await topic.storage.seal()
    results = await asyncio.gather(
        *(topic.publish_one(broker._producers[pid], frame(f"m{i}", pid)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, TopicSealedError) for r in results), results
    assert topic.storage.next_offset == before
    assert topic.coalescer.messages == 0


class DurabilityGate:
    """Holds the topic's durability waits until released, so a test can queue calls while one wait is
    in progress instead of racing it (an interval-synced WAL may answer in well under a millisecond)."""

    def __init__(self, topic, monkeypatch) -> None:
        self._released = asyncio.Event()
        self._storage = topic.storage
        real_wait = topic.storage.wait_durable

        async def gated_wait(target):
            await self._released.wait()
            return await real_wait(target)

        monkeypatch.setattr(topic.storage, "wait_durable", gated_wait)  # undone at the test's end at the latest
        self._real_wait = real_wait

    def release(self) -> None:
        """Lets the waits in progress go on; later waits are not held."""
        self._storage.wait_durable = self._real_wait
        self._released.set()


async def test_waits_on_a_busy_topic_are_spaced_and_an_idle_call_is_not_held(broker, monkeypatch):
    from danube.broker import coalesce

    monkeypatch.setattr(coalesce, "MIN_WAIT_SPACING_S", 0.3)
    pid = await broker.create_producer(T, "p", reliable=True)
    c = broker.topics[T].coalescer
    gate = DurabilityGate(broker.topics[T], monkeypatch)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.ensure_future(broker.publish_one(pid, frame("a", pid)))
    await async_wait_until(lambda: c.durability_waits == 1, what="the first call's durability wait")
    second = asyncio.ensure_future(broker.publish_one(pid, frame("b", pid)))  # arrives during the wait
    await async_wait_until(lambda: len(c._waiters) == 1, what="the second call held")
    gate.release()
    assert await first == 0
    assert loop.time() - started < 0.3  # the first call on an idle topic is not held
    assert await second == 1
    assert loop.time() - started >= 0.3  # the next wait started no sooner than the spacing
    assert c.durability_waits == 2


async def test_spacing_grows_while_the_loop_is_saturated_and_falls_back_on_light_traffic(broker, monkeypatch):
    from danube.broker import coalesce

    # Spacings longer than a durability wait on a loaded machine (an fdatasync can take tens of ms):
    # a wait longer than the spacing leaves nothing to hold, and the test would see no hold at all.
    monkeypatch.setattr(coalesce, "MIN_WAIT_SPACING_S", 0.2)
    monkeypatch.setattr(coalesce, "MAX_WAIT_SPACING_S", 0.5)
    monkeypatch.setattr(coalesce, "LATE_S", -1.0)  # every hold counts as woken late: a saturated loop
    monkeypatch.setattr(coalesce, "BUSY_BATCH", 0)  # no wait counts as light traffic
    pid = await broker.create_producer(T, "p", reliable=True)
    c = broker.topics[T].coalescer
    sent = 0

    async def burst(n):
        # one call on the idle topic, then n held during its wait: they need one spaced hold
        nonlocal sent
        gate = DurabilityGate(broker.topics[T], monkeypatch)
        waits = c.durability_waits
        first = asyncio.ensure_future(broker.publish_one(pid, frame(f"m{sent}", pid)))
        await async_wait_until(lambda: c.durability_waits == waits + 1, what="the first call's durability wait")
        rest = [asyncio.ensure_future(broker.publish_one(pid, frame(f"m{sent + 1 + i}", pid))) for i in range(n)]
        await async_wait_until(lambda: len(c._waiters) == n, what="the calls held during the wait")
        gate.release()
        offsets = await asyncio.gather(first, *rest)
        assert offsets == list(range(sent, sent + n + 1))  # order kept, every call answered
        sent += n + 1

    assert c._spacing == 0.2
    await burst(5)
    assert c._spacing == 0.4  # doubled after a late hold
    await burst(5)
    assert c._spacing == 0.5  # capped at the maximum
    monkeypatch.setattr(coalesce, "BUSY_BATCH", 4)
    await burst(1)  # waits answering one call each: light traffic
    assert c._spacing == 0.2
