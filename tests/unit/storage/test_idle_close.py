"""A reliable topic idle for ``storage.wal.idle_close_seconds`` releases its WAL's files,
threads and cache, and reopens them lazily on the next use (functional, not timed)."""

from __future__ import annotations

import asyncio
import os
import shutil

from danube.storage import StorageConfig
from tests.support.waiting import async_wait_until
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of, read_all


def _fds_under(path: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(path):
                n += 1
        except OSError:
            pass
    return n


def test_config_knob():
    cfg = StorageConfig.from_dict({"mode": "local", "wal": {"idle_close_seconds": 5}}, data_dir="/tmp/x")
    assert cfg.wal.idle_close_s == 5.0
    assert (
        StorageConfig.from_dict(
            {"mode": "local", "wal": {"idle_close_seconds": None}}, data_dir="/tmp/x"
        ).wal.idle_close_s
        is None
    )
    assert StorageConfig.from_dict({"mode": "local"}, data_dir="/tmp/x").wal.idle_close_s == 60.0
    cfg = StorageConfig.from_dict({"mode": "local", "wal": {"initial_file_kb": 64}}, data_dir="/tmp/x")
    assert cfg.wal.open_kwargs()["initial_file_bytes"] == 64 * 1024
    assert StorageConfig.from_dict({"mode": "local"}, data_dir="/tmp/x").wal.initial_file_bytes == 256 * 1024


async def test_idle_topic_releases_its_wal_and_reopens_on_use(tmp_path, factories):
    cfg = make_config(
        tmp_path, mode="local", file_kb=16, wal={"max_file_mb": 16 / 1024, "sync": "always", "idle_close_seconds": 0.2}
    )
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    await append(storage, 0, 200)
    wal_dir = os.path.abspath(storage.wal_dir)
    for _ in range(100):
        if storage.wal.suspended:
            break
        await asyncio.sleep(0.05)
    assert storage.wal.suspended
    if storage.wal._dormant.released is not None:
        assert storage.wal._dormant.released.wait(10)
    assert _fds_under(wal_dir) == 1  # the lock file
    # a consumer reading history reopens it; so does a producer
    assert offsets_of(await storage.read_frames(0, 4096))[0] == 0
    assert not storage.wal.suspended
    first, last = await append(storage, 200, 5)
    assert (first, last) == (200, 204)
    records = await read_all(storage, 0, 204)
    assert [r.offset for r in records] == list(range(205))


async def test_crash_recovery_of_a_topic_closed_while_idle(tmp_path, factories):
    cfg = make_config(
        tmp_path, mode="local", file_kb=16, wal={"max_file_mb": 16 / 1024, "sync": "always", "idle_close_seconds": 0.1}
    )
    storage = await factories(cfg, background=False).open_topic(TOPIC)
    await append(storage, 0, 150)
    storage.wal.idle_seconds()
    await asyncio.sleep(0.15)
    assert storage._suspend_if_idle(0.1)
    # the process dies here: copy the directory as it is and open the copy as a new broker would
    crashed = tmp_path / "after-crash"
    shutil.copytree(tmp_path / "broker", crashed / "broker", ignore=shutil.ignore_patterns("wal.lock"))
    cfg2 = make_config(crashed, mode="local", file_kb=16, wal={"max_file_mb": 16 / 1024, "sync": "always"})
    again = await factories(cfg2, broker_id="broker-b").open_topic(TOPIC)
    assert again.recovery.source == "local"
    assert again.next_offset == 150
    records = await read_all(again, 0, 149)
    assert [r.offset for r in records] == list(range(150))


async def test_a_topic_reopened_by_use_is_released_again(tmp_path, factories):
    """Suspended, reopened by an append, idle again: released again (the maintenance task must not
    sleep until its next retention check, minutes away, because the log was suspended when it last
    looked).  The scale bench's topics hit this when their first idle check came before their
    producer's first send: the topic kept its threads and files for the 5-minute check interval."""
    cfg = make_config(
        tmp_path, mode="local", file_kb=16, wal={"max_file_mb": 16 / 1024, "sync": "always", "idle_close_seconds": 0.2}
    )
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    wal = storage.wal
    await async_wait_until(lambda: wal.suspended, 10, "an idle topic that was never written is released")
    assert (await append(storage, 0, 1)) == (0, 0)  # reopens it
    assert not wal.suspended and wal.resume_count == 1
    await async_wait_until(lambda: wal.suspended, 10, "the topic reopened by an append is released again once idle")
    # and once more through a read below the end (the cache is empty after a suspend)
    assert offsets_of(await storage.read_frames(0, 4096)) == [0]
    assert not wal.suspended and wal.resume_count == 2
    await async_wait_until(lambda: wal.suspended, 10, "the topic reopened by a read is released again once idle")
