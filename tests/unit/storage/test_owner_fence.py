"""The owner epoch of a WAL on a shared root, and the cursor floor of a crashed owner's topic."""

from __future__ import annotations

import asyncio

import pytest

from danube import message_codec
from danube.errors import StorageError, TopicSealedError
from danube.metadata import keys
from danube.storage.owner_fence import epoch_key, read_epoch_file
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of


async def test_a_new_owner_continues_the_shared_wal_and_fences_the_old_one(tmp_path, factories, metadata):
    # the WAL root on the shared directory: both brokers open the same WAL directory
    cfg = make_config(tmp_path, local_wal_root=str(tmp_path / "shared" / "wal"))
    old = await factories(cfg, "broker-a").open_topic(TOPIC)
    await append(old, 0, 10)
    assert read_epoch_file(cfg.wal_dir(TOPIC)) == 1
    old.wal.close()  # what a kill -9 leaves: files and the lock released, nothing sealed, nothing exported
    new = await factories(cfg, "broker-b").open_topic(TOPIC)
    assert new.recovery.source == "local" and new.next_offset == 10  # the dead owner's tail is kept
    assert read_epoch_file(cfg.wal_dir(TOPIC)) == 2
    assert b'"epoch":2' in (await metadata.get(epoch_key(cfg.metadata_prefix, TOPIC))).value
    assert offsets_of(new.wal.read_frames(0, 1 << 20)) == list(range(10))
    # the old owner (still running, cut off) acks nothing and writes nothing any more
    with pytest.raises(TopicSealedError):
        await old.wait_durable(9)
    answered = asyncio.get_running_loop().create_future()
    old.when_durable(9, answered.set_result)  # the commit queue's way: the callback hears it too
    assert not answered.done()  # never called before when_durable returns
    assert isinstance(await asyncio.wait_for(answered, 10), TopicSealedError)
    with pytest.raises(TopicSealedError):
        old.append_frames(bytearray(b""))
    assert await append(new, 10, 5) == (10, 14)


async def test_a_new_owner_without_the_wal_never_starts_below_the_acked_cursors(tmp_path, factories, metadata):
    cfg = make_config(tmp_path, "local")
    await metadata.put_json(keys.subscription_cursor(TOPIC, "s1"), 41)
    await metadata.put_json(keys.subscription_cursor(TOPIC, "s2"), 7)
    storage = await factories(cfg, "broker-b").open_topic(TOPIC)
    assert storage.next_offset == 42
    assert await append(storage, 0, 1) == (42, 42)


async def _read_all(storage) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while True:
        view = await storage.read_frames(out[-1][0] + 1 if out else 0, 4096)
        if not len(view):
            return out
        out += [(r.offset, bytes(r.payload[:10])) for r in message_codec.iter_records(view)]


async def test_a_read_only_owner_keeps_reading_while_the_next_owner_continues_the_wal(tmp_path, factories):
    # a broker cut off from etcd past its lease ttl: it gives the shared WAL up but its consumers read on
    cfg = make_config(tmp_path, local_wal_root=str(tmp_path / "shared" / "wal"))
    old = await factories(cfg, "broker-a").open_topic(TOPIC)
    await append(old, 0, 30)
    assert await old.make_read_only("broker-a cannot reach the metadata store") == 29
    assert old.read_only and old.describe()["read_only"]
    with pytest.raises(
        TopicSealedError,
        match="read-only on this broker: broker-a cannot reach the metadata store; publish refused, nothing stored",
    ) as info:
        old.append_frames(bytearray(message_codec.encode_payloads([b"zombie"])))
    assert info.value.retriable
    with pytest.raises(StorageError, match="read-only"):
        await old.seal()
    new = await factories(cfg, "broker-b").open_topic(TOPIC)  # the lock is free: no WalBusyError
    assert new.recovery.source == "local" and new.next_offset == 30
    assert await append(new, 30, 20) == (30, 49)
    # its own offsets, all of them, nothing after; then the log as the next owner has it
    assert await _read_all(old) == [(i, b"msg-%06d" % i) for i in range(30)]
    await old.close()
    assert await _read_all(new) == [(i, b"msg-%06d" % i) for i in range(50)]
