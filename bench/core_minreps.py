"""The compiled core's hot paths as min-of-repetitions timings, in microseconds.

    PYTHONPATH=<tree>/src python bench/core_minreps.py

The minimum of many repetitions is what the code costs when nothing else runs,
so it compares two builds on a shared, loaded machine where pytest-benchmark's
medians and the system benchmarks (danube bench, spark_decode) swing by 2x:
run it alternately against two worktrees (docs/benchmarks.md, "Core layout refactor").
Codec on 1 MiB of 100 B frames, Arrow column decode (the Spark data source's
step), and the WAL (sync='never'): per-record append, batch append,
append_frames, read_frames and read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import timeit

import danube.message_codec as f
from danube import _native
from danube.wal import Wal

arrowcols = _native.load("arrowcols")
results: dict[str, float] = {}


def timed(name, fn, number=5, repeat=30):
    results[name] = min(timeit.Timer(fn).repeat(repeat=repeat, number=number)) / number * 1e6


def main() -> None:
    small = [os.urandom(100) for _ in range((1 << 20) // 138)]
    batch = f.encode_payloads(small)
    writable = bytearray(batch)
    large = f.encode_payloads([os.urandom(1024) for _ in range((1 << 20) // 1062)], key="k", attributes={"a": "b"})
    timed("validate_100B_1MiB", lambda: f.validate(batch))
    timed("encode_payloads_100B_1MiB", lambda: f.encode_payloads(small))
    timed("decode_batch_100B_1MiB", lambda: f.decode_batch(batch), number=2)
    timed("stamp_100B_1MiB", lambda: f.stamp_offsets(writable, 5))
    timed("arrow_decode_100B_1MiB", lambda: arrowcols.decode_arrow_buffers(batch))
    timed("arrow_decode_1KiB_1MiB", lambda: arrowcols.decode_arrow_buffers(large))
    root = tempfile.mkdtemp()
    try:
        wal = Wal.open(os.path.join(root, "wal"), sync="never", max_file_bytes=512 << 20)
        p100, p1k = os.urandom(100), os.urandom(1024)

        def per_record(payload=p100):
            append = wal.append
            for _ in range(1000):
                append(payload)

        timed("wal_append_x1000_100B", per_record, number=1, repeat=60)
        timed("wal_append_x1000_1KiB", lambda: per_record(p1k), number=1, repeat=60)
        payloads = [p100] * 1000
        timed("wal_append_batch_1000x100B", lambda: wal.append_batch(payloads), number=1, repeat=60)
        frames = bytearray(f.encode_payloads(payloads))
        timed("wal_append_frames_1000x100B", lambda: wal.append_frames(bytearray(frames)), number=1, repeat=60)
        first = wal.first_offset
        timed("wal_read_frames_1MiB", lambda: wal.read_frames(first + 1000, 1 << 20), number=20)
        timed("wal_read_1000_records", lambda: wal.read(first + 1000, 1000), number=2)
        wal.close()
    finally:
        shutil.rmtree(root)
    print(" ".join(f"{name}={us:.2f}" for name, us in results.items()))


if __name__ == "__main__":
    main()
