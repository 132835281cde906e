"""Stopping a topic's maintenance task is never lost, whatever wakes the task at that moment.

The task waits for a rotation (its wake event, set from the WAL's file thread through
``call_soon_threadsafe``) or a deadline.  Under Python 3.11, ``asyncio.wait_for`` returns the
inner result instead of raising when the cancellation and the inner completion land in the same
loop iterations (CPython gh-86296), so a rotation finishing just before ``seal()`` left the task
running and ``seal()`` waiting for it forever (seen once in a full-suite run of the handoff test).
These tests force that interleaving with a real rotation: the listener runs, its wake is
delivered, and in the same iteration ``seal()`` / ``close()`` cancels the task.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.storage.conftest import TOPIC, append, make_config


async def _rotation_wake_pending(storage) -> None:
    """Rotate, let the file thread finish the rotation (its listener queues ``_wake.set`` on the loop),
    then run exactly that callback: the wake is set and the task's wait is about to complete."""
    await asyncio.sleep(0.05)  # the maintenance task is parked in its wait
    assert storage.wal.rotate() is not None
    # blocking on purpose: the loop must not run the listener's callback before we want it to
    assert storage.wal.finish_rotations(10)
    assert not storage._wake.is_set()
    await asyncio.sleep(0)  # the loop runs the queued _wake.set, then this task again
    assert storage._wake.is_set()


@pytest.mark.parametrize("how", ["seal", "close"])
async def test_stop_lands_with_a_rotation_wake(tmp_path, factories, how):
    cfg = make_config(
        tmp_path,
        mode="local",
        file_kb=64,
        wal={"max_file_mb": 64 / 1024, "sync": "always", "idle_close_seconds": None},
        export_interval_seconds=30,
    )
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    await append(storage, 0, 10)
    task = storage._task
    await _rotation_wake_pending(storage)
    try:
        async with asyncio.timeout(20):
            if how == "seal":
                assert await storage.seal() == 9
            else:
                await storage.close()
    except TimeoutError:
        pytest.fail(f"{how}() did not return in 20 s: the maintenance task ignored its cancellation")
    assert task.done() and task.cancelled()
    assert storage._task is None


async def test_maintenance_still_wakes_on_rotation(tmp_path, factories):
    """The wait still ends on a rotation (not only on its deadline): a rotated file is exported
    long before the 30 s export interval."""
    cfg = make_config(
        tmp_path,
        mode="shared_fs",
        file_kb=64,
        wal={"max_file_mb": 64 / 1024, "sync": "always", "idle_close_seconds": None},
        export_interval_seconds=30,
    )
    storage = await factories(cfg, background=True).open_topic(TOPIC)
    await append(storage, 0, 10)
    await asyncio.sleep(0.05)
    assert storage.wal.rotate() is not None
    async with asyncio.timeout(20):
        while storage.durable_end < 9:
            await asyncio.sleep(0.02)
    assert storage.durable_end == 9
