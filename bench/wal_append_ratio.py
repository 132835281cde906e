"""Per-record ``Wal.append`` against a plain-Python ``struct.pack`` + buffered ``write`` loop
(the target: the WAL at least 1.5x the loop), both in one process, interleaved.

Each repetition appends ``--records`` 100 B records to a fresh log (sync=never, 256 MiB files,
so no rotation) and then writes the same frame bytes (the WAL's frame header packed with
``struct``, no checksum: ``bench/embedded_peers.py``'s ``file_loop``) to a fresh file with a
64 KiB buffer; the order of the two alternates from one repetition to the next.  Opening the
log and creating the file are outside the timed part; the loop's final ``flush`` is inside.

Reported: records/s of each (median and best), and the per-repetition ratio WAL / loop (median,
min, max): a repetition's two loops ran within a few tens of milliseconds of each other, so the
machine's load moves both.

    python bench/wal_append_ratio.py                       # 30 repetitions of 200,000 records
    PYTHONPATH=<tree>/src python bench/wal_append_ratio.py --json   # another build, one JSON line
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

_FRAME_HEAD = struct.Struct("<QIIQQBBHH")  # the WAL's frame header (docs/wal.md; _pure/frame.py)


def wal_run(directory: str, i: int, n: int, payload: bytes) -> float:
    from danube.wal import Wal

    path = os.path.join(directory, f"wal-{i}")
    with Wal.open(path, sync="never", max_file_bytes=256 << 20) as wal:
        append = wal.append
        t0 = time.perf_counter_ns()
        for _ in range(n):
            append(payload)
        dt = time.perf_counter_ns() - t0
    shutil.rmtree(path)
    return dt


def loop_run(directory: str, i: int, n: int, payload: bytes) -> float:
    path = os.path.join(directory, f"loop-{i}.log")
    with open(path, "ab", buffering=1 << 16) as f:
        pack, w = _FRAME_HEAD.pack, f.write
        now = time.time_ns() // 1_000_000
        body = 22 + len(payload)
        t0 = time.perf_counter_ns()
        for off in range(n):
            w(pack(off, 0, body, now, 0, 0, 0, 0, 0) + payload)
        f.flush()
        dt = time.perf_counter_ns() - t0
    os.unlink(path)
    return dt


def measure(reps: int, n: int, size: int, directory: str) -> dict:
    payload = b"p" * size
    wal_ns, loop_ns, ratios = [], [], []
    gc.disable()
    try:
        wal_run(directory, -1, min(n, 20_000), payload)  # warm up imports and code paths
        loop_run(directory, -1, min(n, 20_000), payload)
        for i in range(reps):
            if i % 2:
                lp = loop_run(directory, i, n, payload)
                w = wal_run(directory, i, n, payload)
            else:
                w = wal_run(directory, i, n, payload)
                lp = loop_run(directory, i, n, payload)
            wal_ns.append(w)
            loop_ns.append(lp)
            ratios.append(lp / w)  # rate ratio: WAL rec/s over loop rec/s
    finally:
        gc.enable()
    return {
        "records": n,
        "size": size,
        "reps": reps,
        "wal_rec_s_median": n * 1e9 / statistics.median(wal_ns),
        "wal_rec_s_best": n * 1e9 / min(wal_ns),
        "loop_rec_s_median": n * 1e9 / statistics.median(loop_ns),
        "loop_rec_s_best": n * 1e9 / min(loop_ns),
        "wal_ns_per_call_best": min(wal_ns) / n,
        "loop_ns_per_call_best": min(loop_ns) / n,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_of_bests": min(loop_ns) / min(wal_ns),
        "load": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where the logs go (default: a temp directory)")
    ap.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="danube-append-ratio-", dir=args.dir)
    try:
        r = measure(args.reps, args.records, args.size, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    import danube

    r["tree"] = os.path.dirname(os.path.dirname(os.path.abspath(danube.__file__)))
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"{r['tree']}: {args.reps} x {args.records:,} records of {args.size} B, "
        f"load {' '.join(f'{x:.2f}' for x in r['load'])}"
    )
    print(
        f"  WAL append()  {r['wal_rec_s_median'] / 1e6:6.2f} M rec/s median, {r['wal_rec_s_best'] / 1e6:6.2f} best"
        f"  ({r['wal_ns_per_call_best']:.0f} ns/call)"
    )
    print(
        f"  struct loop   {r['loop_rec_s_median'] / 1e6:6.2f} M rec/s median, {r['loop_rec_s_best'] / 1e6:6.2f} best"
        f"  ({r['loop_ns_per_call_best']:.0f} ns/call)"
    )
    print(
        f"  ratio WAL/loop: median {r['ratio_median']:.2f}, min {r['ratio_min']:.2f}, "
        f"max {r['ratio_max']:.2f}, of bests {r['ratio_of_bests']:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
