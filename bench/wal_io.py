"""Why the WAL writes through mmap: mapping copies vs pwrite, by write size.

    python bench/wal_io.py

Writes 128 MiB into a preallocated file in chunks of 138 B (one 100 B record
frame), 4 KiB, 64 KiB and 1 MiB, once by slice-assigning into a shared mapping
and once with os.pwrite, and prints MB/s for each.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time

TOTAL = 128 << 20


def run(directory: str, kind: str, chunk: int) -> float:
    path = os.path.join(directory, f"{kind}-{chunk}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, TOTAL)
    buf = os.urandom(chunk)
    n = TOTAL // chunk
    try:
        if kind == "mmap":
            mm = mmap.mmap(fd, TOTAL)
            t = time.perf_counter()
            pos = 0
            for _ in range(n):
                mm[pos : pos + chunk] = buf
                pos += chunk
            dt = time.perf_counter() - t
            mm.close()
        else:
            t = time.perf_counter()
            pos = 0
            for _ in range(n):
                os.pwrite(fd, buf, pos)
                pos += chunk
            dt = time.perf_counter() - t
    finally:
        os.close(fd)
        os.unlink(path)
    return n * chunk / dt / 1e6


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="danube-io-") as d:
        print(f"{'write size':>10} {'mmap MB/s':>10} {'pwrite MB/s':>12}")
        for chunk in (138, 4096, 65536, 1 << 20):
            print(f"{chunk:>10} {run(d, 'mmap', chunk):>10.0f} {run(d, 'pwrite', chunk):>12.0f}")


if __name__ == "__main__":
    main()
