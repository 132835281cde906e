"""``BrokerService.publish_nowait`` with an ``answer``: the batch lane's per-call path gets no
future; the topic's commit answers the caller with its tag, producer and offsets (or the error),
and settles the broker's count of publishes in flight (what a drain waits for) once per commit."""

import asyncio
import contextlib

import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.errors import InvalidArgumentError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory

T = "/default/answers"


@pytest.fixture(params=["always", "never"])
async def broker(request, tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": request.param}}, data_dir=str(tmp_path))
    b = BrokerService(
        metadata,
        StorageFactory(config, metadata, broker_id="test"),
        dispatch=DispatchSettings(cursor_flush_interval_ms=50),
    )
    await b.start()
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await metadata.close()


def batch(texts, producer_id: int) -> bytearray:
    return bytearray(
        b"".join(message_codec.encode_record(t.encode(), publish_time=1, producer_id=producer_id) for t in texts)
    )


async def test_each_publish_is_answered_once_in_order_and_the_count_settles(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    answered: list = []
    all_done = asyncio.get_running_loop().create_future()

    def answer(tag, producer_id, first, last, exc):
        answered.append((tag, producer_id, (first, last), exc))
        if len(answered) == 5 and not all_done.done():
            all_done.set_result(None)

    taken = [broker.publish_nowait(pid, batch([f"a{i}", f"b{i}"], pid), answer, 100 + i) for i in range(5)]
    assert all(t is True for t in taken)  # taken, no future
    assert broker._publishing == 5
    assert answered == []  # never inside the publish call
    await asyncio.wait_for(all_done, 10)
    assert answered == [(100 + i, pid, (2 * i, 2 * i + 1), None) for i in range(5)]
    assert broker._publishing == 0  # settled in the callback that answered them
    assert broker._published.is_set()
    await asyncio.sleep(0.05)
    assert len(answered) == 5  # once each


async def test_an_answered_publish_on_a_rate_limited_topic_is_answered_from_its_task(broker):
    from danube.broker.ratelimit import PublishGate

    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    topic.publish_gate = PublishGate(1000)
    answered: list = []
    done = asyncio.get_running_loop().create_future()

    def answer(tag, producer_id, first, last, exc):
        answered.append((tag, producer_id, first, last, exc))
        if len(answered) == 3 and not done.done():
            done.set_result(None)

    for i in range(3):
        assert broker.publish_nowait(pid, batch([f"m{i}"], pid), answer, i) is True
    await asyncio.wait_for(done, 10)
    assert answered == [(i, pid, i, i, None) for i in range(3)]
    assert broker._publishing == 0


async def test_a_failed_sync_answers_every_batch_it_covered_with_the_error(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    storage = topic.storage
    storage.durable_now = lambda offset: False
    storage.when_durable = lambda offset, callback: asyncio.get_running_loop().call_soon(callback, OSError("disk gone"))
    answered: list = []
    for i in range(3):
        broker.publish_nowait(pid, batch([f"m{i}"], pid), lambda *a: answered.append(a), i)
    assert await broker.drain_publishes(5)
    assert [(tag, first, last, type(exc)) for tag, _p, first, last, exc in answered] == [
        (i, i, i, OSError) for i in range(3)
    ]
    assert topic.readable_next == 0  # never made visible


async def test_a_refused_publish_raises_and_is_never_answered(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    other = await broker.create_producer("/default/other", "q", reliable=True)
    answered: list = []
    with pytest.raises(InvalidArgumentError):  # a frame naming another producer
        broker.publish_nowait(pid, batch(["x"], other), lambda *a: answered.append(a), 1)
    await asyncio.sleep(0.05)
    assert answered == []
    assert broker._publishing == 0
    assert broker.topics[T].storage.next_offset == 0
