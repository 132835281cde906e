"""Cursor persistence: every moved cursor in one metadata transaction per flush."""

import asyncio
import contextlib

import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings, service_cursors
from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory


@pytest.fixture
async def broker(tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path))
    factory = StorageFactory(config, metadata, broker_id="test")
    b = BrokerService(metadata, factory, dispatch=DispatchSettings(cursor_flush_interval_ms=5000))
    await b.start()
    b._flush_task.cancel()  # the test flushes by hand: no background flush in between
    yield b
    with contextlib.suppress(Exception):
        await b.stop()
        await metadata.close()


async def ack_one_each(broker, topics):
    for name in topics:
        pid = await broker.create_producer(name, "p", reliable=True)
        cid = await broker.subscribe(name, "s", "c")
        await broker.publish(pid, bytearray(message_codec.encode_record(b"x", publish_time=1, producer_id=pid)))
        d = await asyncio.wait_for(broker.receive(cid, max_messages=10, max_bytes=1 << 20), 5)
        await broker.ack_ranges(cid, [(d.first_offset, d.last_offset)])


async def test_many_moved_cursors_are_one_transaction_each_chunk(broker, monkeypatch):
    monkeypatch.setattr(service_cursors, "CURSORS_PER_TXN", 8)
    topics = [f"/default/c{i}" for i in range(20)]
    await ack_one_each(broker, topics)
    before = await broker.metadata.revision()
    assert await broker.flush_cursors() == 20
    assert await broker.metadata.revision() - before == 3  # 8 + 8 + 4, not 20 writes
    for name in topics:
        assert await broker.metadata.get_json(keys.subscription_cursor(name, "s")) == 0
    assert await broker.flush_cursors() == 0  # nothing moved since


async def test_a_failed_write_keeps_every_cursor_of_it_dirty(broker, monkeypatch):
    topics = [f"/default/f{i}" for i in range(3)]
    await ack_one_each(broker, topics)

    async def broken(*args, **kwargs):
        raise OSError("metadata store unreachable")

    monkeypatch.setattr(broker.metadata, "txn", broken)
    with pytest.raises(OSError):
        await broker.flush_cursors()
    assert all(broker.topics[n].subscriptions["s"].dirty for n in topics)
    monkeypatch.undo()
    assert await broker.flush_cursors() == 3


async def test_an_ack_wakes_a_receive_waiting_on_a_full_window(tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    config = StorageConfig.from_dict({"wal": {"sync": "never"}}, data_dir=str(tmp_path))
    b = BrokerService(
        metadata, StorageFactory(config, metadata, broker_id="t"), dispatch=DispatchSettings(max_unacked_messages=2)
    )
    await b.start()
    try:
        pid = await b.create_producer("/default/w", "p", reliable=True)
        cid = await b.subscribe("/default/w", "s", "c")
        for i in range(4):
            await b.publish(pid, bytearray(message_codec.encode_record(b"m%d" % i, publish_time=1, producer_id=pid)))
        d = await asyncio.wait_for(b.receive(cid, max_messages=10, max_bytes=1 << 20), 5)
        assert (d.first_offset, d.last_offset) == (0, 1)  # the window is full now
        waiting = asyncio.ensure_future(b.receive(cid, max_messages=10, max_bytes=1 << 20))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        assert b.ack_ranges_now(cid, [(0, 0)]) == 1
        d = await asyncio.wait_for(waiting, 5)
        assert (d.first_offset, d.last_offset) == (2, 2)  # one more fits
        assert b.ack_ranges_now(999, [(0, 0)]) is None  # not loaded: the awaited path
    finally:
        await b.stop()
        await metadata.close()


async def test_a_flush_sends_its_chunks_together_and_a_failed_one_keeps_only_its_own_dirty(broker, monkeypatch):
    monkeypatch.setattr(service_cursors, "CURSORS_PER_TXN", 4)
    topics = [f"/default/g{i}" for i in range(10)]
    await ack_one_each(broker, topics)
    real_txn = broker.metadata.txn
    in_flight = 0
    most = 0
    calls = 0

    async def txn(compare, success, failure=()):
        nonlocal in_flight, most, calls
        calls += 1
        call = calls
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.01)
            if call == 2:
                raise OSError("this chunk's write failed")
            return await real_txn(compare, success, failure)
        finally:
            in_flight -= 1

    monkeypatch.setattr(broker.metadata, "txn", txn)
    with pytest.raises(OSError):
        await broker.flush_cursors()
    assert calls == 3 and most == 3  # 4 + 4 + 2 cursors, the three writes under way at once
    dirty = [n for n in topics if broker.topics[n].subscriptions["s"].dirty]
    assert dirty == topics[4:8]  # the second chunk's, and only those
    for name in topics[:4] + topics[8:]:
        assert await broker.metadata.get_json(keys.subscription_cursor(name, "s")) == 0
    assert await broker.flush_cursors() == 4
