"""Under sync=always and sync=interval a publish is answered only after the sync that covers it
(danube.broker.commits over the WAL's group commit): held syncs hold the answers back."""

import asyncio
import contextlib
import threading

import pytest

from danube import message_codec
from danube.broker import BrokerService, DispatchSettings
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory
from tests.support.waiting import async_wait_until

T = "/default/held"


@pytest.fixture(params=["always", "interval"])
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


class HeldSyncs:
    """The topic's WAL syncs block until released; what happened is recorded in order."""

    def __init__(self, syncer) -> None:
        self.events: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        real = syncer._sync_files

        def held() -> None:
            self.entered.set()
            assert self.release.wait(30), "the test never released the sync"
            real()
            self.events.append("synced")

        syncer._sync_files = held
        syncer._fs_target = None  # a round of many logs would syncfs instead: sync the files


@pytest.fixture()
def hold():
    made: list[HeldSyncs] = []

    def hold(topic) -> HeldSyncs:
        made.append(HeldSyncs(topic.storage.wal._syncer))
        return made[-1]

    yield hold
    for held in made:  # a failed test does not leave a sync thread blocked
        held.release.set()


async def test_no_publish_is_answered_or_visible_before_its_sync_returns(broker, hold):
    pid = await broker.create_producer(T, "p", reliable=True)
    cid = await broker.subscribe(T, "s", "c")
    topic = broker.topics[T]
    held = hold(topic)
    futures = [broker.publish_nowait(pid, batch([f"a{i}", f"b{i}"], pid)) for i in range(5)]
    for fut in futures:
        fut.add_done_callback(lambda _f: held.events.append("answered"))
    await async_wait_until(held.entered.is_set, what="the sync started")
    await asyncio.sleep(0.2)  # many loop turns while the disk has not answered
    assert not any(f.done() for f in futures)
    assert topic.readable_next == 0 and held.events == []
    receive = asyncio.ensure_future(broker.receive(cid, max_messages=100, max_bytes=1 << 20))
    await asyncio.sleep(0.05)
    assert not receive.done()  # nothing to deliver before it is durable

    held.release.set()
    assert await asyncio.wait_for(asyncio.gather(*futures), 30) == [(2 * i, 2 * i + 1) for i in range(5)]
    assert held.events[0] == "synced" and held.events.count("answered") == 5
    assert topic.storage.wal.durable_offset >= 9
    delivered = await asyncio.wait_for(receive, 10)
    assert [bytes(r.payload) for r in message_codec.iter_records(delivered.frames)][:2] == [b"a0", b"b0"]


async def test_a_publish_during_a_held_sync_waits_for_the_next_one(broker, hold):
    pid = await broker.create_producer(T, "p", reliable=True)
    topic = broker.topics[T]
    held = hold(topic)
    first = broker.publish_nowait(pid, batch(["one"], pid))
    await async_wait_until(held.entered.is_set, what="the first sync started")
    # appended while that sync is in flight: not covered by it (it read its target before)
    second = broker.publish_nowait(pid, batch(["two"], pid))
    held.entered.clear()
    held.release.set()
    assert await asyncio.wait_for(first, 30) == (0, 0)
    assert await asyncio.wait_for(second, 30) == (1, 1)
    assert held.events.count("synced") == 2
    assert topic.storage.wal.durable_offset >= 1
