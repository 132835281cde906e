"""fdatasync latency after appends into preallocated space: unwritten extents vs written zeros.

    python bench/fdatasync_extents.py [--dir DIR] [--appends 400] [--chunk-kib 64] [--file-mib 64] [--rounds 2]

A WAL file is preallocated with ``posix_fallocate``, which leaves *unwritten*
extents: the first fdatasync after data lands in one must also commit the
extent's conversion to written (a journal commit on ext4/xfs).  A file whose
space was written with zeros beforehand only needs its data pages flushed.
This measures both on the same disk, alternating, and prints p50 / p99 / max in
ms per fdatasync, so the choice of preallocation can be judged on the machine
that runs the broker.  ``--dir`` must be on the disk the WAL uses (default: a
temporary directory under the current one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def measure(directory: str, mode: str, appends: int, chunk: int, size: int) -> tuple[float, float, float]:
    path = os.path.join(directory, f"fdatasync-{mode}.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, size)
        else:
            zeros = bytes(1 << 20)
            for pos in range(0, size, len(zeros)):
                os.pwrite(fd, zeros[: min(len(zeros), size - pos)], pos)
        os.fsync(fd)
        data = os.urandom(chunk)
        latencies = []
        for i in range(min(appends, size // chunk)):
            os.pwrite(fd, data, i * chunk)
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99)], latencies[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="directory on the WAL's disk (default: a temp dir here)")
    parser.add_argument("--appends", type=int, default=400)
    parser.add_argument("--chunk-kib", type=int, default=64)
    parser.add_argument("--file-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir or ".", prefix="fdatasync-bench-") as directory:
        print(f"{'preallocation':14s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s}")
        for _ in range(args.rounds):
            for mode in ("fallocate", "zeros"):
                p50, p99, worst = measure(directory, mode, args.appends, args.chunk_kib << 10, args.file_mib << 20)
                print(f"{mode:14s} {p50:8.2f} {p99:8.2f} {worst:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
