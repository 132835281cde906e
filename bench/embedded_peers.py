"""Embedded-log peers, one run, same workload, matched durability.

    python bench/embedded_peers.py [--records 400000]

Workload: append N records (100 B payloads, batches of 1000) then read them all
back, for danube.wal, a plain-Python file-append loop, sqlite3 (WAL mode) and
lmdb.  Durability is matched: "nosync" (no fsync at all: danube sync='never',
sqlite synchronous=OFF, lmdb sync=False) and "sync/batch" (one
fsync/fdatasync per batch: danube sync='always', sqlite synchronous=FULL, lmdb
sync=True, the loop flush+fdatasync).  The file loop writes the same framed
bytes as the WAL (16-byte header + 22-byte body header + payload, offsets
and publish time) but computes no checksum, through a 64 KiB-buffered file.
Opening (file creation, preallocation) is outside every timing, and each
measurement starts after an ``os.sync()`` so no peer pays for another's writeback.

Also measured: per-record ``append()`` against the loop writing one frame per
``write``; validate + CRC32C of a 1 MiB buffer of 1 KiB records; 1 KiB records
with sync=always in 64 KiB batches against the disk's fdatasync'd sequential
write bandwidth (os.write + fdatasync of 64 KiB, alternated with the WAL in
slices so both see the same background load); broadcast fanout to 1/4/16 tail
readers (interleaved, best of 3 each: the ratio of two single noisy figures is
mostly noise on a shared 2-core box).  Prints a table and the pass/fail of
each target (README, "Benchmarks"), and writes JSON to bench/out/embedded_peers.json (and
a timestamped copy).
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

from danube import _native, message_codec
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


_FRAME_HEAD = struct.Struct("<QIIQQBBHH")  # offset, crc, body_len, publish_time, producer, flags, 0, attrs, key_len


def file_loop(d, batches, sync, per_record=False):
    """The plain-Python baseline: the WAL's frame bytes, no checksum, buffered writes."""
    path = os.path.join(d, "log.bin")
    with open(path, "ab", buffering=1 << 16) as f:

        def write():
            pack = _FRAME_HEAD.pack
            w = f.write
            off = 0
            for b in batches:
                now = time.time_ns() // 1_000_000
                if per_record:
                    for p in b:
                        w(pack(off, 0, 22 + len(p), now, 0, 0, 0, 0, 0) + p)
                        off += 1
                else:
                    parts = []
                    for p in b:
                        parts.append(pack(off, 0, 22 + len(p), now, 0, 0, 0, 0, 0))
                        parts.append(p)
                        off += 1
                    w(b"".join(parts))
                if sync:
                    f.flush()
                    os.fdatasync(f.fileno())
            f.flush()
            return off

        w = _timed(write)

    def read():
        with open(path, "rb") as f:
            data = f.read()
        pos, n, count = 0, len(data), 0
        mv = memoryview(data)
        unpack = _U32.unpack_from
        while pos < n:
            (ln,) = unpack(data, pos + 12)
            _payload = mv[pos + 38 : pos + 16 + ln]
            pos += 16 + ln
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


def sync_bandwidths(d, seconds=3.0, slices=6, block=64 * 1024):
    """(disk, wal) bytes/s: fdatasync'd 64 KiB os.write appends, and danube sync=always
    appends of 60 x 1 KiB records (one ~64 KiB batch, payload bytes counted),
    alternated in slices."""
    path = os.path.join(d, "disk.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    buf = os.urandom(block)
    batch = [os.urandom(1024) for _ in range(60)]
    disk_bytes = wal_bytes = 0
    disk_time = wal_time = 0.0
    per_slice = seconds / slices / 2
    try:
        with Wal.open(os.path.join(d, "wal"), sync="always", max_file_bytes=256 << 20) as wal:
            for _ in range(slices):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < per_slice:
                    os.write(fd, buf)
                    os.fdatasync(fd)
                    disk_bytes += block
                disk_time += time.perf_counter() - t0
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < per_slice:
                    wal.append_batch(batch)  # returns after the batch's fdatasync
                    wal_bytes += 60 * 1024
                wal_time += time.perf_counter() - t0
    finally:
        os.close(fd)
    return disk_bytes / disk_time, wal_bytes / wal_time


def validate_gbps(seconds=0.5):
    """validate (checksums, lengths, offsets) of a 1 MiB buffer of 1 KiB records, GB/s."""
    payload = os.urandom(1024)
    count = (1 << 20) // (1024 + 38)
    buf = message_codec.encode_payloads([payload] * count, base_offset=0)
    best = float("inf")
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t = time.perf_counter()
        for _ in range(20):
            message_codec.validate(buf)
        best = min(best, (time.perf_counter() - t) / 20)
    return len(buf) / best / 1e9


def fanout(d, readers, records=200_000, batch=1000):
    """Seconds to append ``records`` and have every one of ``readers`` tail readers receive
    them all.  Readers count bytes (every frame here is 138 bytes), so the figure is the
    WAL's cost of delivering the views, not the readers' own work on them."""
    payloads = [b"x" * 100] * batch
    frame_bytes = message_codec.HEADER_SIZE + message_codec.MIN_BODY + 100

    async def run():
        with Wal.open(d, sync="never", max_file_bytes=256 << 20) as wal:

            async def reader():
                got = 0
                async for view in wal.tail_frames(0, 1 << 20):
                    got += len(view)
                    if got >= records * frame_bytes:
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


# ---------------------------------------------------------------- latency


def _percentiles(samples_ns):
    xs = sorted(samples_ns)
    if not xs:
        return {}
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))] / 1e6  # noqa: E731
    return {"n": len(xs), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "p999_ms": pick(0.999), "max_ms": xs[-1] / 1e6}


def rotation_latency(d, sync, batches=6000, frames_per_batch=8, payload=400, max_file_bytes=256 << 10, durable_every=4):
    """Caller-side time of ``append_frames`` (what the broker's event loop pays) across many
    rotations: small files (256 KiB: a rotation every ~75 calls), 8 x 400 B frames a call,
    ``await wait_durable`` every ``durable_every`` calls like a broker acking producers.
    Returns percentiles over all calls and over the calls that rotated."""
    template = message_codec.encode_payloads([os.urandom(payload)] * frames_per_batch, base_offset=0)

    async def run():
        all_ns, rot_ns = [], []
        with Wal.open(d, sync=sync, max_file_bytes=max_file_bytes) as wal:
            perf = time.perf_counter_ns
            for i in range(batches):
                buf = bytearray(template)
                seq_before = len(wal.rotated_files())
                t = perf()
                _first, last = wal.append_frames(buf)
                dt = perf() - t
                all_ns.append(dt)
                if len(wal.rotated_files()) != seq_before:
                    rot_ns.append(dt)
                if i % durable_every == durable_every - 1:
                    await wal.wait_durable(last)
                else:
                    await asyncio.sleep(0)
            keeper = getattr(wal, "_keeper", None)  # files made ahead vs created by the writer
            made = (keeper.spares_used, keeper.fallback_creates) if keeper is not None else None
        return all_ns, rot_ns, made

    all_ns, rot_ns, made = asyncio.run(run())
    return {"all": _percentiles(all_ns), "rotating": _percentiles(rot_ns), "spares_used_vs_created": made}


def wait_durable_latency(d, sync="interval", interval_ms=5.0, waits=600, busy=False):
    """Latency of ``append_frames`` + ``await wait_durable`` of one 400 B frame, the calls
    spaced by a random 0..2 intervals so they land anywhere in the sync cycle.  ``busy``: a
    second task appends a frame every ~0.2 ms meanwhile (the sync thread never idles)."""
    import random

    rng = random.Random(7)
    template = message_codec.encode_payloads([os.urandom(400)], base_offset=0)

    async def run():
        out = []
        with Wal.open(d, sync=sync, sync_interval_ms=interval_ms, max_file_bytes=64 << 20) as wal:
            done = False

            async def background():
                while not done:
                    wal.append_frames(bytearray(template))
                    await asyncio.sleep(0.0002)

            bg = asyncio.create_task(background()) if busy else None
            for _ in range(waits):
                await asyncio.sleep(rng.uniform(0, 2 * interval_ms / 1000))
                t = time.perf_counter_ns()
                _f, last = wal.append_frames(bytearray(template))
                await wal.wait_durable(last)
                out.append(time.perf_counter_ns() - t)
            done = True
            if bg is not None:
                await bg
        return out

    return _percentiles(asyncio.run(run()))


def latency_main(root) -> dict:
    out = {}
    for sync in ("always", "interval", "never"):
        d = tempfile.mkdtemp(dir=root)
        os.sync()
        out[f"rotation_{sync}"] = rotation_latency(d, sync)
    d = tempfile.mkdtemp(dir=root)
    out["wait_durable_interval_5ms"] = wait_durable_latency(d)
    d = tempfile.mkdtemp(dir=root)
    out["wait_durable_interval_5ms_busy"] = wait_durable_latency(d, busy=True)
    d = tempfile.mkdtemp(dir=root)
    out["wait_durable_always"] = wait_durable_latency(d, sync="always")
    print(f"danube extensions: {_native.extensions_loaded()}  load average {os.getloadavg()[0]:.2f}")
    print(f"{'measurement':<34}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'max ms':>9}")
    for name, value in out.items():
        parts = value.items() if "all" in value else [("", value)]
        for sub, st in parts:
            if not isinstance(st, dict) or not st:
                continue
            label = f"{name} {sub}".strip()
            print(
                f"{label:<34}{st['n']:>7}{st['p50_ms']:>9.3f}{st['p99_ms']:>9.3f}{st['p999_ms']:>10.3f}"
                f"{st['max_ms']:>9.3f}"
            )
    for name, value in out.items():
        if value.get("spares_used_vs_created"):
            used, created = value["spares_used_vs_created"]
            print(f"{name}: {used} rotations took a file made ahead, {created} created one themselves")
    return out


# ---------------------------------------------------------------- main

TARGETS = [
    # (key, description, threshold, at least (True) / at most (False))
    ("batch_append_rps", "batch append 100 B, sync=never (rec/s)", 5e6, True),
    ("batch_vs_lmdb", "  ... vs lmdb batched put", 2.5, True),
    ("batch_vs_sqlite", "  ... vs sqlite3 (WAL mode)", 10.0, True),
    ("per_record_rps", "per-record append() 100 B (rec/s)", 1.5e6, True),
    ("per_record_vs_file_loop", "  ... vs plain-Python file loop", 1.0, True),
    ("validate_gbps", "validate + CRC32C, 1 MiB of 1 KiB records (GB/s)", 5.0, True),
    ("sync_always_1k_vs_disk", "sync=always 1 KiB x 64 KiB batches vs disk", 0.5, True),
    ("fanout16_vs_fanout1", "fanout to 16 readers vs 1 (time)", 2.0, False),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--sync-records", type=int, default=20_000)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out", "embedded_peers.json"))
    ap.add_argument(
        "--latency", action="store_true", help="only the latency figures: append_frames across rotations, wait_durable"
    )
    args = ap.parse_args()
    if args.latency:
        root = tempfile.mkdtemp(prefix="danube-bench-")
        try:
            record = {
                "latency": latency_main(root),
                "extensions": _native.extensions_loaded(),
                "load_average": os.getloadavg(),
                "time": time.time(),
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)
        path = os.path.join(os.path.dirname(os.path.abspath(args.out)), "wal_latency.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {path}")
        return
    n = args.records
    payloads = [os.urandom(100) for _ in range(1000)]
    batches = [payloads] * (n // 1000)
    sync_batches = [payloads] * (args.sync_records // 1000)
    rows = []
    root = tempfile.mkdtemp(prefix="danube-bench-")
    load_before = os.getloadavg()

    def fresh():
        # every measurement starts without the previous one's writeback still running
        # (kernel flusher threads compete for the same 2 cores)
        os.sync()
        return tempfile.mkdtemp(dir=root)

    try:
        peers = [("danube.wal", danube_batch), ("file loop", file_loop), ("sqlite3 WAL", sqlite_peer)]
        if lmdb is not None:
            peers.append(("lmdb", lmdb_peer))
        for mode, bs in (("nosync", batches), ("sync/batch", sync_batches)):
            for name, fn in peers:
                (cnt, wt), (rc, rt) = fn(fresh(), bs, mode != "nosync")
                assert rc == cnt, (name, rc, cnt)
                rows.append(
                    {
                        "peer": name,
                        "mode": mode,
                        "op": "batch append",
                        "records": cnt,
                        "append_rps": cnt / wt,
                        "read_rps": rc / rt,
                    }
                )
        per = [p for b in batches for p in b]
        cnt, wt = danube_per_record(fresh(), per)
        rows.append(
            {
                "peer": "danube.wal",
                "mode": "nosync",
                "op": "append()",
                "records": cnt,
                "append_rps": cnt / wt,
                "read_rps": None,
            }
        )
        (cnt, wt), _ = file_loop(fresh(), batches, False, per_record=True)
        rows.append(
            {
                "peer": "file loop",
                "mode": "nosync",
                "op": "per-record write",
                "records": cnt,
                "append_rps": cnt / wt,
                "read_rps": None,
            }
        )

        val_gbps = validate_gbps()
        disk_bw, wal_bw = sync_bandwidths(fresh())
        fan_runs = {k: [] for k in (1, 4, 16)}
        for _ in range(3):
            for k in fan_runs:
                fan_runs[k].append(fanout(fresh(), k))
        fan = {k: min(v) for k, v in fan_runs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    def rps(peer, mode, op="batch append"):
        return next(r["append_rps"] for r in rows if r["peer"] == peer and r["mode"] == mode and r["op"] == op)

    results = {
        "batch_append_rps": rps("danube.wal", "nosync"),
        "batch_vs_lmdb": rps("danube.wal", "nosync") / rps("lmdb", "nosync") if lmdb else None,
        "batch_vs_sqlite": rps("danube.wal", "nosync") / rps("sqlite3 WAL", "nosync"),
        "per_record_rps": rps("danube.wal", "nosync", "append()"),
        "per_record_vs_file_loop": rps("danube.wal", "nosync", "append()")
        / rps("file loop", "nosync", "per-record write"),
        "validate_gbps": val_gbps,
        "sync_always_1k_vs_disk": wal_bw / disk_bw,
        "fanout16_vs_fanout1": fan[16] / fan[1],
    }
    print(
        f"danube extensions: {_native.extensions_loaded()}  python {sys.version.split()[0]}  "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} ({os.cpu_count()} CPUs)"
    )
    print(f"{'peer':<14}{'mode':<12}{'op':<18}{'append rec/s':>14}{'read rec/s':>14}")
    for r in rows:
        read = f"{r['read_rps']:>14,.0f}" if r["read_rps"] else f"{'-':>14}"
        print(f"{r['peer']:<14}{r['mode']:<12}{r['op']:<18}{r['append_rps']:>14,.0f}{read}")
    print(
        f"disk fdatasync'd 64 KiB writes: {disk_bw / 1e6:,.1f} MB/s; danube sync=always 1 KiB x 64 KiB "
        f"batches: {wal_bw / 1e6:,.1f} MB/s"
    )
    print("fanout 200k records to N readers, best of 3 (s): " + ", ".join(f"{k}: {v:.3f}" for k, v in fan.items()))
    print(f"{'target':<52}{'measured':>14}{'needed':>14}  result")
    passed = {}
    for key, label, threshold, at_least in TARGETS:
        value = results[key]
        ok = value is not None and (value >= threshold if at_least else value <= threshold)
        passed[key] = ok
        shown = "n/a" if value is None else (f"{value:,.0f}" if value >= 1000 else f"{value:.2f}")
        need = (">= " if at_least else "<= ") + (f"{threshold:,.0f}" if threshold >= 1000 else f"{threshold:g}")
        print(f"{label:<52}{shown:>14}{need:>14}  {'PASS' if ok else 'FAIL'}")
    record = {
        "rows": rows,
        "disk_sync_bw": disk_bw,
        "wal_sync_always_1k_bw": wal_bw,
        "fanout_seconds": fan,
        "fanout_runs": fan_runs,
        "results": results,
        "passed": passed,
        "load_average": {"before": load_before, "after": load_after},
        "extensions": _native.extensions_loaded(),
        "time": time.time(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    stamped = os.path.splitext(args.out)[0] + time.strftime("-%Y%m%d-%H%M%S") + ".json"
    for path in (args.out, stamped):
        with open(path, "w") as f:
            json.dump(record, f, indent=2)
    print(f"wrote {args.out} and {stamped}")


if __name__ == "__main__":
    main()
