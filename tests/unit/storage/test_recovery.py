"""Recovery-start precedence: sealed → local continuity → durable catalog → empty."""

from __future__ import annotations

import os

import pytest

from danube.errors import TopicSealedError
from danube.metadata import keys
from danube.storage.recovery import StorageStateSealed, read_sealed_state
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of, read_all


async def test_empty_topic_starts_at_zero(tmp_path, factories):
    storage = await factories(make_config(tmp_path)).open_topic(TOPIC)
    assert storage.recovery.source == "empty"
    assert (storage.first_offset, storage.next_offset) == (0, 0)
    assert await storage.read_frames(0, 1024) == b"" or len(await storage.read_frames(0, 1024)) == 0


async def test_local_continuity_continues_the_wal(tmp_path, factories):
    cfg = make_config(tmp_path)
    first = await factories(cfg).open_topic(TOPIC)
    await append(first, 0, 30)
    await first.close()
    again = await factories(cfg).open_topic(TOPIC)
    assert again.recovery.source == "local"
    assert again.next_offset == 30
    assert again.first_offset == 0


async def test_sealed_state_wins_and_is_cleared_once_open(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    old = await factories(cfg, "broker-a").open_topic(TOPIC)
    await append(old, 0, 22)
    assert await old.seal() == 21
    state = await read_sealed_state(metadata, cfg.metadata_prefix, TOPIC)
    assert state == StorageStateSealed(True, 21, "broker-a", state.timestamp)
    assert not os.path.exists(cfg.wal_dir(TOPIC)), "seal clears the local WAL"

    new = await factories(cfg, "broker-b").open_topic(TOPIC)
    assert new.recovery.source == "sealed" and new.recovery.hot_cutover
    assert new.next_offset == 22 and new.hot_start == 22 and new.first_offset == 0
    assert await metadata.get(keys.storage_state(cfg.metadata_prefix, TOPIC)) is None


async def test_sealed_state_beats_a_leftover_local_wal(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    old = await factories(cfg).open_topic(TOPIC)
    await append(old, 0, 40)
    await old.close()
    # Another owner took the topic, wrote up to 99 and sealed it (its history is durable elsewhere).
    await metadata.put(
        keys.storage_state(cfg.metadata_prefix, TOPIC), StorageStateSealed(True, 99, "broker-z", 1).to_json()
    )
    new = await factories(cfg).open_topic(TOPIC)
    assert new.recovery.source == "sealed"
    assert new.next_offset == 100
    first, _ = await append(new, 100, 1)
    assert first == 100


async def test_durable_catalog_used_without_local_continuity(tmp_path, factories):
    cfg = make_config(tmp_path)
    old = await factories(cfg).open_topic(TOPIC)
    await append(old, 0, 50)
    await old.exporter.export_through(old.next_offset - 1)
    await old.close()
    os.rename(cfg.wal_dir(TOPIC), str(tmp_path / "lost-disk"))  # the broker's disk is gone
    new = await factories(cfg).open_topic(TOPIC)
    assert new.recovery.source == "durable" and new.next_offset == 50
    records = await read_all(new, 10, 49)
    assert [r.offset for r in records] == list(range(10, 50))


async def test_stale_local_wal_behind_durable_history_is_set_aside(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    a = await factories(cfg, "a").open_topic(TOPIC)
    await append(a, 0, 10)
    await a.close()
    stash = str(tmp_path / "a-wal")
    os.rename(cfg.wal_dir(TOPIC), stash)
    # broker b owns it from the durable catalog (empty) ... and writes 0..29 durably, then dies
    b = await factories(cfg, "b").open_topic(TOPIC)
    await append(b, 0, 30)
    await b.exporter.export_through(29)
    await b.close()
    import shutil

    shutil.rmtree(cfg.wal_dir(TOPIC))
    os.rename(stash, cfg.wal_dir(TOPIC))  # a's old WAL (0..9) comes back
    c = await factories(cfg, "c").open_topic(TOPIC)
    assert c.next_offset == 30, "a stale local WAL must not rewind the offsets"
    assert [p for p in os.listdir(os.path.dirname(cfg.wal_dir(TOPIC))) if ".stale-" in p]
    assert offsets_of(await c.read_frames(5, 1 << 20))[0] == 5


async def test_sealed_empty_topic_resumes_at_zero(tmp_path, factories):
    cfg = make_config(tmp_path)
    old = await factories(cfg).open_topic(TOPIC)
    assert await old.seal() == -1
    new = await factories(cfg).open_topic(TOPIC)
    assert new.next_offset == 0


async def test_writes_after_seal_are_refused(tmp_path, factories):
    from danube import message_codec

    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 3)
    assert await storage.seal() == 2
    assert await storage.seal() == 2, "seal is idempotent"
    with pytest.raises(TopicSealedError):
        storage.append_frames(bytearray(message_codec.encode_payloads([b"late"])))
