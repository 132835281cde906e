"""The active WAL file's committed tail in durable history: periodic tail exports that continue one
another, the export at a graceful close, and the guard against a second owner's segments."""

from __future__ import annotations

import asyncio
import time

import pytest

from danube.errors import StorageError
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import list_segments, read_segment, topic_prefix
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of


def ranges(backend):
    return [(d.start_offset, d.end_offset) for d in list_segments(backend, topic_prefix(TOPIC))]


async def test_tail_exports_continue_each_other_across_a_rotation(tmp_path, factories):
    cfg = make_config(tmp_path, file_kb=16)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 30)
    assert storage.wal.rotated_files() == [], "all 30 records are in the active file"
    first = await storage.exporter.export_committed()
    assert [(d.start_offset, d.end_offset) for d in first] == [(0, 29)]
    assert await storage.exporter.export_committed() == [], "nothing new: no empty segment"
    await append(storage, 30, 120)  # past the 16 KiB file: rotations in between
    assert storage.wal.rotated_files(), "the WAL rotated"
    await storage.exporter.export_committed()
    backend = cfg.make_backend()
    got = ranges(backend)
    assert got[0] == (0, 29) and got[-1][1] == 149
    assert all(b[0] == a[1] + 1 for a, b in zip(got, got[1:])), f"no overlap, no gap: {got}"
    seen = []
    for desc in list_segments(backend, topic_prefix(TOPIC)):
        seen += offsets_of(read_segment(backend, desc))
    assert seen == list(range(150))
    # The rotation listener's export only continues from the durable end (nothing twice).
    assert await storage.exporter.export_rotated() == []


async def test_background_export_follows_the_committed_end_within_the_interval(tmp_path, factories):
    cfg = make_config(tmp_path, file_kb=1024, export_interval_seconds=0.3)
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    for round_ in range(3):
        _, last = await append(storage, round_ * 10, 10)
        acked = time.monotonic()
        while storage.durable_end < last:
            assert time.monotonic() - acked < 0.3 + 2.0, "the tail was not exported within the interval"
            await asyncio.sleep(0.02)
    assert ranges(cfg.make_backend())[-1][1] == 29


async def test_graceful_close_exports_the_tail_and_plain_close_does_not(tmp_path, factories, caplog):
    cfg = make_config(tmp_path, file_kb=1024)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 25)
    await storage.close()
    assert ranges(cfg.make_backend()) == [], "close() alone (fenced, handed over) exports nothing"
    again = await factories(cfg).open_topic(TOPIC)
    await append(again, 25, 5)
    with caplog.at_level("INFO", logger="danube.storage.topic_storage"):
        await again.close(export=True)
    assert ranges(cfg.make_backend()) == [(0, 29)]
    assert "exported offsets 0..29 at shutdown" in caplog.text


async def test_graceful_close_in_local_mode_leaves_the_tail_in_the_wal(tmp_path, factories):
    cfg = make_config(tmp_path, "local", file_kb=1024)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 10)
    await storage.close(export=True)
    assert ranges(cfg.make_backend()) == [], "local mode exports lazily (retention, seal)"


async def test_a_second_owner_cannot_publish_over_the_first(tmp_path, factories, metadata):
    cfg = make_config(tmp_path, file_kb=1024)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 10)
    # A stale owner's view of the catalog, loaded before this owner exported.
    stale = await SegmentCatalog.load(metadata, cfg.metadata_prefix, TOPIC)
    (desc,) = await storage.exporter.export_committed()
    with pytest.raises(StorageError, match="published by another broker"):
        await stale.publish(desc)


async def test_a_system_topics_history_is_kept_per_broker(tmp_path, factories):
    from danube.storage.factory import durable_topic

    assert durable_topic(TOPIC, "b1") == TOPIC
    assert durable_topic("/system/load_reports", "broker 1/x") == "/system/load_reports.broker_1_x"
    for broker in ("b1", "b2"):  # every broker writes its own copy (its own WAL), each from offset 0
        cfg = make_config(tmp_path, file_kb=1024, local_wal_root=str(tmp_path / broker / "wal"))
        storage = await factories(cfg, broker_id=broker).open_topic("/system/load_reports")
        await append(storage, 0, 3)
        await storage.close(export=True)
    backend = cfg.make_backend()
    for broker in ("b1", "b2"):
        descs = list_segments(backend, topic_prefix(f"/system/load_reports.{broker}"))
        assert [(d.start_offset, d.end_offset, d.topic) for d in descs] == [(0, 2, f"/system/load_reports.{broker}")]
