"""``BrokerService.publish_nowait`` with an ``answer``: the batch lane's per-call path gets one
loop callback per publish, which settles the broker's count of publishes in flight (what a
drain waits for) and then answers the caller with its tag, producer and future."""

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


async def test_each_publish_is_answered_once_in_order_after_the_count_settles(broker):
    pid = await broker.create_producer(T, "p", reliable=True)
    answered: list = []
    all_done = asyncio.get_running_loop().create_future()

    def answer(tag, producer_id, fut):
        # the broker's own count already left this publish out when its answer runs
        answered.append((tag, producer_id, fut.result(), broker._publishing))
        if len(answered) == 5 and not all_done.done():
            all_done.set_result(None)

    futures = [broker.publish_nowait(pid, batch([f"a{i}", f"b{i}"], pid), answer, 100 + i) for i in range(5)]
    assert broker._publishing == 5
    await asyncio.wait_for(all_done, 10)
    assert [(tag, p, offsets) for tag, p, offsets, _ in answered] == [
        (100 + i, pid, (2 * i, 2 * i + 1)) for i in range(5)
    ]
    assert [left for *_, left in answered] == [4, 3, 2, 1, 0]
    assert all(f.done() for f in futures)
    await asyncio.sleep(0)
    assert len(answered) == 5  # once each
    assert broker._published.is_set()


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
