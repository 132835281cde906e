"""Batch publishes without a task per call: appended at once, answered by one durability waiter
per topic (danube.broker.commits), over real WAL storage."""

import asyncio
import contextlib

import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.errors import InvalidArgumentError
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory

T = "/default/commits"


@pytest.fixture(params=["always", "never"])
async def broker(request, tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": request.param}}, data_dir=str(tmp_path))
    factory = StorageFactory(config, metadata, broker_id="test")
    b = BrokerService(metadata, factory, dispatch=DispatchSettings(cursor_flush_interval_ms=50))
    await b.start()
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await metadata.close()


def batch(texts, producer_id: int) -> bytearray:
    return bytearray(
        b"".join(message_codec.encode_record(t.encode(), publish_time=1, producer_id=producer_id) for t in texts)
    )


async def test_batches_are_appended_in_call_order_and_answered_with_their_offsets(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    topic = broker.topics[T]
    # one loop turn: 50 two-message calls, each appended now, none answered yet
    futures = [broker.publish_nowait(pid, batch([f"a{i}", f"b{i}"], pid)) for i in range(50)]
    assert topic.storage.next_offset == 100
    assert not any(f.done() for f in futures)
    assert topic.readable_next == 0  # nothing visible before it is durable
    answers = await asyncio.gather(*futures)
    assert answers == [(2 * i, 2 * i + 1) for i in range(50)]
    assert topic.commits.waits < 50  # one waiter covered many calls
    assert topic.readable_next == 100
    assert broker._producers[pid].messages_in == 100
    got = []
    while len(got) < 100:
        d = await asyncio.wait_for(broker.receive(cid, max_messages=1000, max_bytes=1 << 20), 5)
        got += [bytes(r.payload).decode() for r in message_codec.iter_records(d.frames)]
    assert got == [x for i in range(50) for x in (f"a{i}", f"b{i}")]
    assert broker._publishing == 0


async def test_a_refused_batch_raises_at_once_and_stores_nothing(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    other = await broker.create_producer("/default/other", "q", reliable=True)
    with pytest.raises(InvalidArgumentError):  # a frame naming another producer
        broker.publish_nowait(pid, batch(["x"], other))
    assert broker.topics[T].storage.next_offset == 0
    assert broker._publishing == 0
    assert await broker.publish_nowait(pid, batch(["y"], pid)) == (0, 0)


async def test_an_unloaded_producer_takes_the_awaited_path(broker):
    assert broker.publish_nowait(12345, batch(["x"], 12345)) is None


async def test_a_failed_durability_wait_fails_the_batches_it_covered_and_the_next_goes_on(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    storage = topic.storage
    real = storage.when_durable
    calls = []

    def failing(offset, callback):
        calls.append(offset)
        if len(calls) == 1:
            asyncio.get_running_loop().call_soon(callback, OSError("disk gone"))
            return
        real(offset, callback)

    storage.when_durable = failing
    storage.durable_now = lambda offset: False  # every commit waits (under sync=never too)
    first = [broker.publish_nowait(pid, batch([f"m{i}"], pid)) for i in range(3)]
    results = await asyncio.gather(*first, return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)
    assert calls == [2]  # one wait for the whole turn, asked for after its appends
    assert topic.readable_next == 0  # not made visible
    assert await broker.publish_nowait(pid, batch(["after"], pid)) == (3, 3)
    assert topic.readable_next == 4
    assert broker._publishing == 0


async def test_a_wait_refused_at_once_fails_its_batches_in_a_later_turn(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    storage = topic.storage
    real = storage.when_durable
    refused = []

    def refusing(offset, callback):
        if not refused:
            refused.append(offset)
            raise OSError("the log is closed")
        real(offset, callback)

    storage.when_durable = refusing
    storage.durable_now = lambda offset: False
    fut = broker.publish_nowait(pid, batch(["x"], pid))
    assert not fut.done()  # never answered inside the publish call
    with pytest.raises(OSError):
        await fut
    assert await broker.publish_nowait(pid, batch(["y"], pid)) == (1, 1)


async def test_a_storage_without_when_durable_is_waited_for_by_a_task(broker):
    # the storage contract's own wait (an extension's storage) still commits, one wait per round
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    storage = topic.storage
    waited = []
    real_wait = storage.wait_durable

    class ContractOnly:  # the contract's methods only, delegating to the real storage
        def __getattr__(self, name):
            if name == "when_durable":
                raise AttributeError(name)
            return getattr(storage, name)

        def durable_now(self, offset):
            return False

        async def wait_durable(self, offset):
            waited.append(offset)
            await real_wait(offset)

    topic.storage = ContractOnly()
    try:
        futures = [broker.publish_nowait(pid, batch([f"m{i}"], pid)) for i in range(4)]
        assert await asyncio.gather(*futures) == [(i, i) for i in range(4)]
        assert waited == [3]  # one wait for the turn's four batches
        assert topic.readable_next == 4
    finally:
        topic.storage = storage


async def test_a_batch_durable_at_once_is_committed_in_the_next_turn_without_a_waiter_task(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    storage = topic.storage
    futures = [broker.publish_nowait(pid, batch([f"m{i}"], pid)) for i in range(3)]
    if not storage.durable_now(2):  # sync=always: not durable before its sync, the waiter task waits
        assert await asyncio.gather(*futures) == [(0, 0), (1, 1), (2, 2)]
        return
    tasks_before = asyncio.all_tasks()
    assert topic.readable_next == 0  # never visible in the turn that appended it
    await asyncio.sleep(0)  # the turn after: one callback committed all three
    assert all(f.done() for f in futures) and [f.result() for f in futures] == [(0, 0), (1, 1), (2, 2)]
    assert topic.readable_next == 3
    assert topic.commits.waits == 1 and topic.commits._waiting_for is None
    assert asyncio.all_tasks() <= tasks_before  # no task was made for it
