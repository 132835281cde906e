"""The WAL's page-cache window, measured: append cost with and without it, after a fill.

    python bench/wal_page_cache.py [--fill-mb 1200] [--mb 448] [--rounds 3] [--dir DIR]

First writes ``--fill-mb`` through a WAL that keeps everything cached (so the page cache
holds that much of this run's data, as a broker's does after its first gigabytes).  Then, in
alternating rounds, writes ``--mb`` more through a fresh WAL with ``page_cache_bytes=None``
(the OS decides) and one with the default window, timing each ``append_frames`` of a
~256 KiB batch (2,300 frames of 100 B) and syncing after each as ``sync=always`` does.
Only the appends after the first 192 MiB of each WAL count (the steady state: the window
has filled and dropped at least once), and every WAL's files stay until the end, as a
broker's do.  Prints ms per append for both and their ratio.  On a VM whose host reclaims free guest
memory (a balloon with free page reporting) the window's appends are several times cheaper;
on a machine without that the two should be alike.  Use a directory on a real disk, not
tmpfs (``--dir``; default: a temporary directory under the current one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from danube import message_codec
from danube.wal import Wal

BATCH = [b"\x00" * 100] * 2300


STEADY_AFTER = 192 << 20


def write(path: str, mib: int, page_cache_bytes) -> list[float]:
    """Append ``mib`` MiB through a fresh WAL; the seconds of each append past STEADY_AFTER."""
    batch = message_codec.encode_payloads(BATCH, publish_time=1)
    took = []
    with Wal.open(path, sync="always", page_cache_bytes=page_cache_bytes) as wal:
        for _ in range((mib << 20) // len(batch)):
            buf = bytearray(batch)
            t = time.perf_counter()
            wal.append_frames(buf)
            took.append(time.perf_counter() - t)
            wal.sync()
    return took[STEADY_AFTER // len(batch) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fill-mb", type=int, default=1200, help="MiB written (and kept cached) first")
    parser.add_argument("--mb", type=int, default=448, help="MiB written per measured WAL (> 192)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the two variants")
    parser.add_argument("--dir", default=None, help="where the WALs go (not tmpfs)")
    args = parser.parse_args()
    if args.mb <= STEADY_AFTER >> 20:
        parser.error("--mb must be more than 192")
    root = tempfile.mkdtemp(prefix="wal-page-cache-", dir=args.dir or os.getcwd())
    try:
        fill = os.path.join(root, "fill")
        print(f"filling: {args.fill_mb} MiB kept in the page cache ...", flush=True)
        write(fill, args.fill_mb, None)
        results: dict[str, list[float]] = {"page cache left to the OS": [], "128 MiB window (default)": []}
        for r in range(args.rounds):
            for label, keep in zip(results, (None, 128 << 20)):
                path = os.path.join(root, f"r{r}-{'os' if keep is None else 'window'}")
                took = write(path, args.mb, keep)
                results[label].append(statistics.median(took) * 1000)
                print(
                    f"round {r + 1}: {label}: {results[label][-1]:.3f} ms per ~256 KiB append "
                    f"(p99 {sorted(took)[int(len(took) * 0.99)] * 1000:.3f} ms)",
                    flush=True,
                )
        base, window = (statistics.median(v) for v in results.values())
        print(
            f"median ms per append: left to the OS {base:.3f}, window {window:.3f}; "
            f"the window's appends take {window / base:.2f}x the time"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
