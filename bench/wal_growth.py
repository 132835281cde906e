"""How a WAL file's space is reserved vs fdatasync latency and disk used.

    python bench/wal_growth.py [--dir DIR] [--appends 400] [--chunk-kib 16] [--file-mib 64] [--rounds 3]

Appends ``chunk`` bytes ``appends`` times with an fdatasync after each, into a file
prepared one of four ways, alternating the ways round by round on the same disk:

- ``fallocate``: the whole file ``posix_fallocate``d up front (the WAL before reservations grew in steps);
- ``sparse``: ``ftruncate`` to the full size only (a hole: blocks are allocated by writeback);
- ``steps``: sparse, with ``posix_fallocate`` ahead of the writer in doubling steps from
  256 KiB (what the WAL does now, see docs/wal.md "Disk: growing in steps");
- ``zeroed``: the whole file written with zeros and synced up front (no unwritten extents).

Prints p50 / p99 / max ms per append+fdatasync and the disk allocated at the end.

``--wal``: the WAL itself instead, as a hot topic -- ``append_batch`` of one ``chunk``-sized
record with sync=always (returns after its fdatasync), 64 MiB files, through rotations; run it
against two builds (``PYTHONPATH=<other tree>/src``) to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

MODES = ("fallocate", "sparse", "steps", "zeroed")


def measure(directory: str, mode: str, appends: int, chunk: int, size: int) -> dict:
    path = os.path.join(directory, f"growth-{mode}.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    allocated = 0
    try:
        if mode == "fallocate":
            os.posix_fallocate(fd, 0, size)
        elif mode == "zeroed":
            block = b"\0" * (1 << 20)
            for pos in range(0, size, len(block)):
                os.pwrite(fd, block, pos)
        else:
            os.ftruncate(fd, size)
            if mode == "steps":
                allocated = 256 << 10
                os.posix_fallocate(fd, 0, allocated)
        os.fsync(fd)
        data = os.urandom(chunk)
        lat = []
        pos = 64
        for _ in range(appends):
            t0 = time.perf_counter()
            if mode == "steps" and pos + chunk > allocated:
                grow = min(size, max(2 * allocated, pos + chunk))
                os.posix_fallocate(fd, allocated, grow - allocated)
                allocated = grow
            os.pwrite(fd, data, pos)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t0) * 1000)
            pos += chunk
        lat.sort()
        return {
            "p50_ms": statistics.median(lat),
            "p99_ms": lat[int(len(lat) * 0.99) - 1],
            "max_ms": lat[-1],
            "disk_mib": os.fstat(fd).st_blocks * 512 / (1 << 20),
            "data_mib": pos / (1 << 20),
        }
    finally:
        os.close(fd)
        os.unlink(path)


def measure_wal(directory: str, appends: int, chunk: int, size: int) -> dict:
    from danube.wal import Wal

    path = os.path.join(directory, "wal")
    data = os.urandom(chunk)
    lat = []
    with Wal.open(path, sync="always", max_file_bytes=size) as wal:
        for _ in range(appends):
            t0 = time.perf_counter()
            wal.append_batch([data])
            lat.append((time.perf_counter() - t0) * 1000)
        rotations = len(wal.rotated_files())
    disk = sum(os.stat(os.path.join(path, n)).st_blocks * 512 for n in os.listdir(path))
    import shutil

    shutil.rmtree(path)
    lat.sort()
    return {
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[int(len(lat) * 0.99) - 1],
        "max_ms": lat[-1],
        "disk_mib": disk / (1 << 20),
        "data_mib": appends * chunk / (1 << 20),
        "rotations": rotations,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--appends", type=int, default=400)
    ap.add_argument("--chunk-kib", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wal", action="store_true", help="measure the WAL (this build) as a hot topic")
    args = ap.parse_args()
    if args.wal:
        with tempfile.TemporaryDirectory(dir=args.dir or ".") as d:
            runs = [measure_wal(d, args.appends, args.chunk_kib << 10, args.file_mib << 20) for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        import danube

        print(
            f"WAL ({os.path.dirname(danube.__file__)}): {args.appends} x {args.chunk_kib} KiB sync=always, "
            f"{args.file_mib} MiB files, {med['rotations']:.0f} rotations: p50 {med['p50_ms']:.3f}  "
            f"p99 {med['p99_ms']:.3f}  max {med['max_ms']:.3f} ms  (load {os.getloadavg()[0]:.1f})"
        )
        return
    out: dict[str, list] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(dir=args.dir or ".") as d:
        for _ in range(args.rounds):
            for mode in MODES:
                out[mode].append(measure(d, mode, args.appends, args.chunk_kib << 10, args.file_mib << 20))
    print(
        f"{args.appends} appends of {args.chunk_kib} KiB + fdatasync each, {args.file_mib} MiB file, "
        f"{args.rounds} rounds (medians); load {os.getloadavg()[0]:.1f}"
    )
    for mode, runs in out.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"  {mode:10s} p50 {med['p50_ms']:.3f}  p99 {med['p99_ms']:.3f}  max {med['max_ms']:.3f} ms   "
            f"disk {med['disk_mib']:.1f} MiB for {med['data_mib']:.1f} MiB of data"
        )
    os.makedirs("bench/out", exist_ok=True)
    with open(f"bench/out/wal_growth-{int(time.time())}.json", "w") as f:
        json.dump({"args": vars(args), "runs": out}, f, indent=1)


if __name__ == "__main__":
    main()
