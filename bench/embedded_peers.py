"""Embedded-log peers, one run, same workload, matched durability.

    python bench/embedded_peers.py [--records 400000] [--quick]

Workload: append N records (100 B payloads, batches of 1000) then read them all
back, for danube.wal, a plain-Python file-append loop (length prefix, no
checksum), sqlite3 (WAL mode) and lmdb.  Durability is matched: "nosync" (no
fsync at all) and "sync/batch" (one fsync/fdatasync per batch).  Also measured:
per-record appends, 1 KiB records with sync=always in 64 KiB batches against the
disk's fdatasync'd sequential write bandwidth (plain os.write + fdatasync of
64 KiB), and broadcast fanout to 1/4/16 tail readers.  Prints a table and
writes JSON to bench/out/embedded_peers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import struct
import sys
import tempfile
import time

from danube import _native
from danube.wal import Wal

try:
    import lmdb
except ImportError:  # pragma: no cover
    lmdb = None

_U32 = struct.Struct("<I")


def _timed(fn):
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t


# ---------------------------------------------------------------- peers

def danube_batch(d, batches, sync):
    with Wal.open(d, sync="always" if sync else "never", max_file_bytes=256 << 20) as wal:
        def write():
            for b in batches:
                wal.append_batch(b)  # sync=always: returns after the batch's fdatasync
            return sum(map(len, batches))

        def read():
            return sum(1 for _ in wal.iter(0))
        return _timed(write), _timed(read)


def danube_per_record(d, payloads):
    with Wal.open(d, sync="never", max_file_bytes=256 << 20) as wal:
        append = wal.append

        def write():
            for p in payloads:
                append(p)
            return len(payloads)
        return _timed(write)


def file_loop(d, batches, sync, per_record=False):
    path = os.path.join(d, "log.bin")
    with open(path, "ab", buffering=1 << 16) as f:
        def write():
            pack = _U32.pack
            for b in batches:
                if per_record:
                    for p in b:
                        f.write(pack(len(p)))
                        f.write(p)
                else:
                    f.write(b"".join(pack(len(p)) + p for p in b))
                if sync:
                    f.flush()
                    os.fdatasync(f.fileno())
            f.flush()
            return sum(map(len, batches))
        w = _timed(write)

    def read():
        data = open(path, "rb").read()
        pos, n, count = 0, len(data), 0
        mv = memoryview(data)
        while pos < n:
            (ln,) = _U32.unpack_from(data, pos)
            _payload = mv[pos + 4:pos + 4 + ln]
            pos += 4 + ln
            count += 1
        return count
    return w, _timed(read)


def sqlite_peer(d, batches, sync):
    con = sqlite3.connect(os.path.join(d, "log.db"), isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(f"PRAGMA synchronous={'FULL' if sync else 'OFF'}")
    con.execute("CREATE TABLE log (offset INTEGER PRIMARY KEY, payload BLOB)")

    def write():
        off = 0
        for b in batches:
            con.execute("BEGIN")
            con.executemany("INSERT INTO log VALUES (?, ?)", zip(range(off, off + len(b)), b))
            con.execute("COMMIT")
            off += len(b)
        return off

    def read():
        return sum(1 for _ in con.execute("SELECT offset, payload FROM log ORDER BY offset"))
    try:
        return _timed(write), _timed(read)
    finally:
        con.close()


def lmdb_peer(d, batches, sync):
    env = lmdb.open(os.path.join(d, "lmdb"), map_size=4 << 30, sync=sync, metasync=sync, writemap=False)

    def write():
        off = 0
        for b in batches:
            with env.begin(write=True) as txn:
                cur = txn.cursor()
                cur.putmulti(((off + i).to_bytes(8, "big"), p) for i, p in enumerate(b))
            off += len(b)
        return off

    def read():
        with env.begin() as txn:
            return sum(1 for _ in txn.cursor())
    try:
        return _timed(write), _timed(read)
    finally:
        env.close()


# ---------------------------------------------------------------- disk and fanout

def disk_sync_bandwidth(d, seconds=1.5, block=64 * 1024):
    path = os.path.join(d, "disk.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = os.urandom(block)
    written = 0
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            os.write(fd, buf)
            os.fdatasync(fd)
            written += block
    finally:
        os.close(fd)
    return written / (time.perf_counter() - t0)


def danube_sync_always_1k(d, seconds=1.5):
    batch = [os.urandom(1024)] * 60  # 60 frames of 1024+38 B: one ~64 KiB batch
    written = 0
    with Wal.open(d, sync="always", max_file_bytes=256 << 20) as wal:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            wal.append_batch(batch)
            written += 60 * 1024
        dt = time.perf_counter() - t0
    return written / dt


def fanout(d, readers, records=200_000, batch=1000):
    payloads = [b"x" * 100] * batch

    async def run():
        with Wal.open(d, sync="never", max_file_bytes=256 << 20) as wal:
            async def reader():
                got = 0
                async for view in wal.tail_frames(0, 1 << 20):
                    got += _count(view)
                    if got >= records:
                        return got

            tasks = [asyncio.create_task(reader()) for _ in range(readers)]
            await asyncio.sleep(0)
            t0 = time.perf_counter()
            for _ in range(records // batch):
                wal.append_batch(payloads)
                await asyncio.sleep(0)
            await asyncio.gather(*tasks)
            return time.perf_counter() - t0
    return asyncio.run(run())


_count = _native.load("ring").count_frames


# ---------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--sync-records", type=int, default=20_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "embedded_peers.json"))
    args = ap.parse_args()
    n = args.records
    payloads = [os.urandom(100) for _ in range(1000)]
    batches = [payloads] * (n // 1000)
    sync_batches = [payloads] * (args.sync_records // 1000)
    rows = []
    root = tempfile.mkdtemp(prefix="danube-bench-")

    def fresh():
        d = tempfile.mkdtemp(dir=root)
        return d

    try:
        peers = [
            ("danube.wal", lambda d, b, s: danube_batch(d, b, s)),
            ("file loop", lambda d, b, s: file_loop(d, b, s)),
            ("sqlite3 WAL", sqlite_peer),
        ]
        if lmdb is not None:
            peers.append(("lmdb", lmdb_peer))
        for mode, bs in (("nosync", batches), ("sync/batch", sync_batches)):
            for name, fn in peers:
                (cnt, wt), (rc, rt) = fn(fresh(), bs, mode != "nosync")
                assert rc == cnt, (name, rc, cnt)
                rows.append({"peer": name, "mode": mode, "op": "batch append", "records": cnt,
                             "append_rps": cnt / wt, "read_rps": rc / rt})
        per = [p for b in batches for p in b]
        cnt, wt = danube_per_record(fresh(), per)
        rows.append({"peer": "danube.wal", "mode": "nosync", "op": "append()", "records": cnt,
                     "append_rps": cnt / wt, "read_rps": None})
        (cnt, wt), _ = file_loop(fresh(), batches, False, per_record=True)
        rows.append({"peer": "file loop", "mode": "nosync", "op": "per-record write", "records": cnt,
                     "append_rps": cnt / wt, "read_rps": None})

        disk_bw = disk_sync_bandwidth(fresh())
        wal_bw = danube_sync_always_1k(fresh())
        fan = {k: fanout(fresh(), k) for k in (1, 4, 16)}
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def rps(peer, mode, op="batch append"):
        return next(r["append_rps"] for r in rows if r["peer"] == peer and r["mode"] == mode and r["op"] == op)

    ratios = {
        "batch_vs_lmdb": rps("danube.wal", "nosync") / rps("lmdb", "nosync") if lmdb else None,
        "batch_vs_sqlite": rps("danube.wal", "nosync") / rps("sqlite3 WAL", "nosync"),
        "per_record_vs_file_loop": rps("danube.wal", "nosync", "append()") / rps("file loop", "nosync",
                                                                                   "per-record write"),
        "sync_always_1k_vs_disk": wal_bw / disk_bw,
        "fanout16_vs_fanout1": fan[16] / fan[1],
    }
    print(f"danube extensions: {_native.extensions_loaded()}  python {sys.version.split()[0]}")
    print(f"{'peer':<14}{'mode':<12}{'op':<18}{'append rec/s':>14}{'read rec/s':>14}")
    for r in rows:
        read = f"{r['read_rps']:>14,.0f}" if r["read_rps"] else f"{'-':>14}"
        print(f"{r['peer']:<14}{r['mode']:<12}{r['op']:<18}{r['append_rps']:>14,.0f}{read}")
    print(f"disk fdatasync'd 64 KiB writes: {disk_bw / 1e6:,.1f} MB/s; danube sync=always 1 KiB x 64 KiB "
          f"batches: {wal_bw / 1e6:,.1f} MB/s")
    print("fanout 200k records to N readers (s): " + ", ".join(f"{k}: {v:.3f}" for k, v in fan.items()))
    for k, v in ratios.items():
        print(f"  {k:<26} {v:.2f}" if v is not None else f"  {k:<26} n/a")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "disk_sync_bw": disk_bw, "wal_sync_always_1k_bw": wal_bw,
                   "fanout_seconds": fan, "ratios": ratios,
                   "extensions": _native.extensions_loaded(), "time": time.time()}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
