"""The owner epoch of a WAL on a shared root, and the cursor floor of a crashed owner's topic."""

from __future__ import annotations

import pytest

from danube.errors import TopicSealedError
from danube.metadata import keys
from danube.storage.fence import epoch_key, read_epoch_file
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
