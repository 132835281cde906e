"""Local rotated files are pruned by size/age only once durable segments cover them."""

from __future__ import annotations

import os
import time

from danube.storage.config import LocalRetention
from danube.storage.retention import choose_prune_through
from danube.wal import WalFileInfo
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of, payload, read_all

NO_SPACE = {"size_mb": 0, "time_minutes": 100000}


def _info(first, last):
    return WalFileInfo(f"/x/{first}", first, first, last, 0)


def test_choose_prune_through_by_size_and_age():
    now = 10_000.0
    stats = [(_info(0, 9), now - 100, 1000), (_info(10, 19), now - 50, 1000), (_info(20, 29), now - 1, 1000)]
    mb = 1024 * 1024
    assert choose_prune_through(stats, LocalRetention(time_minutes=1000, size_mb=5), now) == -1
    assert choose_prune_through(stats, LocalRetention(time_minutes=1000, size_mb=1500 / mb), now) == 19
    assert choose_prune_through(stats, LocalRetention(time_minutes=1, size_mb=5), now) == 9  # only >60 s old
    assert choose_prune_through(stats, LocalRetention(time_minutes=0.5, size_mb=5), now) == 19
    assert choose_prune_through(stats, LocalRetention(time_minutes=1000, size_mb=0), now) == 29


async def test_uncovered_files_are_kept_until_exported(tmp_path, factories):
    cfg = make_config(tmp_path, "shared_fs", local_retention=NO_SPACE)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    rotated = storage.wal.rotated_files()
    decision = await storage.retention.enforce()
    assert decision.waiting_for_export and decision.pruned_through == -1
    assert all(os.path.exists(f.path) for f in rotated), "nothing pruned before it is durable"

    await storage.exporter.export_rotated()
    decision = await storage.retention.enforce()
    assert decision.pruned_through == rotated[-1].last_offset
    assert not any(os.path.exists(f.path) for f in rotated)
    assert storage.hot_start == rotated[-1].last_offset + 1 and storage.first_offset == 0
    records = await read_all(storage, 0, 59)
    assert [bytes(r.payload) for r in records] == [payload(i) for i in range(60)]


async def test_local_mode_exports_before_pruning(tmp_path, factories):
    cfg = make_config(tmp_path, "local", local_retention=NO_SPACE)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    assert storage.durable_end == -1
    decision = await storage.retention.enforce()
    assert decision.pruned_through >= 0 and storage.durable_end >= decision.pruned_through
    assert offsets_of(await storage.read_frames(0, 1 << 20))[0] == 0


async def test_age_limit_prunes_only_old_files(tmp_path, factories):
    cfg = make_config(tmp_path, "shared_fs", local_retention={"time_minutes": 1, "size_mb": 1000})
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    await storage.exporter.export_rotated()
    rotated = storage.wal.rotated_files()
    old = time.time() - 3600
    os.utime(rotated[0].path, (old, old))
    decision = await storage.retention.enforce()
    assert decision.pruned_through == rotated[0].last_offset
    assert os.path.exists(rotated[1].path)


async def test_background_loop_exports_and_prunes_on_rotation(tmp_path, factories):
    import asyncio

    cfg = make_config(tmp_path, "shared_fs", local_retention=NO_SPACE)
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    await append(storage, 0, 60)
    for _ in range(200):
        if storage.durable_end >= 47 and storage.hot_start > 0:
            break
        await asyncio.sleep(0.02)
    assert storage.durable_end >= 47 and storage.hot_start > 0
    records = await read_all(storage, 0, 59)
    assert [r.offset for r in records] == list(range(60))
