"""danube.wal benchmarks (asv): appends, reads, tail and fanout on a temp directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

from danube import _native
from danube.wal import Wal

BATCH = 1000
_count = _native.load("ring").count_frames


class _WalBench:
    def setup(self, *params):
        self.dir = tempfile.mkdtemp(prefix="danube-asv-")
        self.wal = Wal.open(os.path.join(self.dir, "wal"), sync="never", max_file_bytes=256 << 20)

    def teardown(self, *params):
        self.wal.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Append(_WalBench):
    """Time to append 1000 records of 100 B or 1 KiB."""

    params = [100, 1024]
    param_names = ["size"]

    def setup(self, size):
        super().setup(size)
        self.payload = os.urandom(size)
        self.payloads = [os.urandom(size) for _ in range(BATCH)]

    def time_append_per_record(self, size):
        append, p = self.wal.append, self.payload
        for _ in range(BATCH):
            append(p)

    def time_append_batch(self, size):
        self.wal.append_batch(self.payloads)


class Read(_WalBench):
    params = [100, 1024]
    param_names = ["size"]

    def setup(self, size):
        super().setup(size)
        self.wal.append_batch([os.urandom(size) for _ in range(BATCH)])

    def time_read(self, size):
        self.wal.read(0, BATCH)

    def time_read_frames(self, size):
        self.wal.read_frames(0, 1 << 20)


class Fanout(_WalBench):
    """Time to deliver 20 batches of 1000 x 100 B records to N tail readers."""

    params = [1, 4, 16]
    param_names = ["readers"]

    def time_fanout(self, readers):
        wal = self.wal
        payloads = [b"x" * 100] * BATCH
        start = wal.next_offset
        total = 20 * BATCH

        async def run():
            async def reader():
                got = 0
                async for view in wal.tail_frames(start, 1 << 20):
                    got += _count(view)
                    if got >= total:
                        return

            tasks = [asyncio.create_task(reader()) for _ in range(readers)]
            await asyncio.sleep(0)
            for _ in range(20):
                wal.append_batch(payloads)
                await asyncio.sleep(0)
            await asyncio.gather(*tasks)

        asyncio.run(run())
