"""Micro-benchmarks of danube.wal (pytest-benchmark).

    python -m pytest bench/micro/test_wal_bench.py --benchmark-only

Appends (per record and per 1000-record batch) at 100 B and 1 KiB, reads,
tail and broadcast fanout to 1/4/16 readers, all with sync='never' so the
numbers measure the WAL, not the disk (bench/embedded_peers.py covers sync).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from danube.wal import Wal

SIZES = [100, 1024]
BATCH = 1000


@pytest.fixture
def wal(tmp_path):
    w = Wal.open(tmp_path / "wal", sync="never", max_file_bytes=256 << 20)
    yield w
    w.close()


@pytest.mark.parametrize("size", SIZES)
def test_append_per_record(benchmark, wal, size):
    payload = os.urandom(size)
    append = wal.append

    def run():
        for _ in range(BATCH):
            append(payload)

    benchmark(run)
    benchmark.extra_info["records_per_s"] = BATCH / benchmark.stats.stats.min


@pytest.mark.parametrize("size", SIZES)
def test_append_batch(benchmark, wal, size):
    payloads = [os.urandom(size) for _ in range(BATCH)]
    benchmark(wal.append_batch, payloads)
    benchmark.extra_info["records_per_s"] = BATCH / benchmark.stats.stats.min


@pytest.mark.parametrize("size", SIZES)
def test_read(benchmark, wal, size):
    wal.append_batch([os.urandom(size) for _ in range(BATCH)])
    benchmark(wal.read, 0, BATCH)
    benchmark.extra_info["records_per_s"] = BATCH / benchmark.stats.stats.min


@pytest.mark.parametrize("size", SIZES)
def test_read_frames(benchmark, wal, size):
    wal.append_batch([os.urandom(size) for _ in range(BATCH)])
    benchmark(wal.read_frames, 0, 1 << 20)


def _fanout(wal, readers: int, batches: int = 20) -> None:
    payloads = [b"x" * 100] * BATCH
    start = wal.next_offset
    total = batches * BATCH

    async def run():
        async def reader():
            got = 0
            async for view in wal.tail_frames(start, 1 << 20):
                got += len(view)  # every frame is 138 bytes: the WAL's delivery cost, not counting work
                if got >= total * 138:
                    return

        tasks = [asyncio.create_task(reader()) for _ in range(readers)]
        await asyncio.sleep(0)
        for _ in range(batches):
            wal.append_batch(payloads)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    asyncio.run(run())


def test_tail(benchmark, wal):
    benchmark.pedantic(_fanout, args=(wal, 1), rounds=5)


@pytest.mark.parametrize("readers", [1, 4, 16])
def test_fanout(benchmark, wal, readers):
    benchmark.group = "fanout"
    benchmark.pedantic(_fanout, args=(wal, readers), rounds=5)
