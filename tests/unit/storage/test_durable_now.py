"""``TopicStorage.durable_now``: whether a commit may skip the durability wait (the batch lane's
commit callback, ``danube.broker.commits``) — only when ``wait_durable`` would return at once."""

from __future__ import annotations

import asyncio

from danube import message_codec
from tests.unit.storage.conftest import TOPIC, make_config


def _batch() -> bytearray:
    return bytearray(message_codec.encode_payloads([b"a", b"b"]))


async def test_under_sync_never_what_was_appended_is_durable_at_once(tmp_path, factories):
    storage = await factories(make_config(tmp_path, "local", wal={"sync": "never"})).open_topic(TOPIC)
    _first, last = storage.append_frames(_batch())
    assert storage.durable_now(last)


async def test_under_sync_always_an_append_is_durable_only_once_synced(tmp_path, factories):
    storage = await factories(make_config(tmp_path, "local")).open_topic(TOPIC)
    _first, last = storage.append_frames(_batch())
    assert not storage.durable_now(last)  # before its fdatasync: a commit waits for it
    await storage.wait_durable(last)
    assert storage.durable_now(last)


async def test_a_storage_with_an_owner_fence_always_waits(tmp_path, factories):
    # (the wait checks the fence: a WAL another broker took over acks nothing)
    cfg = make_config(tmp_path, local_wal_root=str(tmp_path / "shared" / "wal"), wal={"sync": "never"})
    storage = await factories(cfg).open_topic(TOPIC)
    assert storage.owner_fence is not None
    _first, last = storage.append_frames(_batch())
    assert not storage.durable_now(last)


async def test_when_durable_calls_back_on_the_loop_once_synced(tmp_path, factories):
    storage = await factories(make_config(tmp_path, "local")).open_topic(TOPIC)
    _first, last = storage.append_frames(_batch())
    answered = asyncio.get_running_loop().create_future()
    storage.when_durable(last, answered.set_result)
    assert not answered.done()  # never called inside when_durable
    assert await asyncio.wait_for(answered, 10) is None
    assert storage.durable_now(last)
