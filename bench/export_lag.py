"""What the tail export costs on a busy topic, and how far durable history lags the committed end.

    flock /tmp/danube-bench.lock python bench/export_lag.py [--seconds 20] [--mb-per-s 4] [--interval 1]

One topic's storage (real WAL, sync=always, 64 MiB files, the broker's background export) in
this process, appended at a fixed rate of 1 KiB records in 64-record batches, each batch awaited
until durable (what an ack waits for).  Two runs per backend (shared_fs: a directory;
object_store: a moto S3 server in its own process), same rate and duration:

* ``tail``: ``export_interval_seconds`` = ``--interval``: every interval the committed tail is
  exported (no file rotates at this size and duration, so everything exported is tail);
* ``rotation only``: an interval longer than the run: nothing is exported while it runs (what a
  busy topic cost before the tail export) -- the baseline for the CPU figure.

Reported per run: this process's CPU seconds per wall second (``getrusage``; moto's own CPU is
measured separately from /proc), bytes and segments uploaded per second, and the lag: for every
batch, from its ack to the moment durable history (the catalog) covered it (sampled every 10 ms),
as median / p99 / max.  JSON in bench/out/export_lag-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from danube import message_codec  # noqa: E402
from danube.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from danube.storage import StorageConfig, StorageFactory  # noqa: E402

RECORD = 1024
BATCH = 64


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_once(mode: str, durable: dict, interval: float, seconds: float, mb_per_s: float, moto_pid: int | None):
    work = tempfile.mkdtemp(prefix="export-lag-")
    section = {
        "mode": mode,
        "export_interval_seconds": interval,
        "wal": {"max_file_mb": 64, "sync": "always"},
        "durable": durable,
    }
    cfg = StorageConfig.from_dict(section, data_dir=work)
    store = EmbeddedMetadataStore(os.path.join(work, "metadata.db"))
    factory = StorageFactory(cfg, store, broker_id="bench", background=True)
    storage = await factory.open_topic("/bench/busy")
    batch = message_codec.encode_payloads([b"x" * RECORD] * BATCH)
    period = BATCH * RECORD / (mb_per_s * 1e6)
    acks: list[tuple[int, float]] = []
    covered: dict[int, float] = {}
    done = asyncio.Event()

    async def watch():
        pending = 0
        while not done.is_set() or pending < len(acks):
            end = storage.durable_end
            now = time.monotonic()
            while pending < len(acks) and acks[pending][0] <= end:
                covered[pending] = now
                pending += 1
            await asyncio.sleep(0.01)
            if done.is_set() and time.monotonic() > stop_at + interval + 10:
                break

    cpu0, moto0, t0 = cpu_s(), proc_cpu_s(moto_pid) if moto_pid else 0.0, time.monotonic()
    stop_at = t0 + seconds
    watcher = asyncio.create_task(watch())
    next_at = t0
    while time.monotonic() < stop_at:
        _first, last = storage.append_frames(bytearray(batch))
        await storage.wait_durable(last)
        acks.append((last, time.monotonic()))
        next_at += period
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    wall = time.monotonic() - t0
    cpu, moto = cpu_s() - cpu0, (proc_cpu_s(moto_pid) - moto0) if moto_pid else None
    exported, segments = storage.exporter.exported_bytes, storage.exporter.exported_segments
    done.set()
    if interval < seconds:
        await watcher
    else:
        watcher.cancel()
    lags = [covered[i] - at for i, (_o, at) in enumerate(acks) if i in covered]
    await factory.close()
    await store.close()
    return {
        "mode": mode,
        "interval": interval,
        "wall_s": wall,
        "appended_mb_per_s": len(acks) * BATCH * RECORD / wall / 1e6,
        "cpu_per_s": cpu / wall,
        "moto_cpu_per_s": moto / wall if moto is not None else None,
        "uploaded_mb_per_s": exported / wall / 1e6,
        "segments_per_s": segments / wall,
        "lag_median_s": statistics.median(lags) if lags else None,
        "lag_p99_s": sorted(lags)[int(len(lags) * 0.99)] if lags else None,
        "lag_max_s": max(lags) if lags else None,
        "batches": len(acks),
        "covered": len(lags),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--mb-per-s", type=float, default=4)
    p.add_argument("--interval", type=float, default=1.0)
    a = p.parse_args()
    import subprocess

    from tests.support.ports import free_port, wait_for_port
    from tests.support.s3 import S3Endpoint

    port = free_port()
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results = []
    try:
        wait_for_port(port, timeout=30)
        s3 = S3Endpoint(f"http://127.0.0.1:{port}", "bench")
        s3.client().create_bucket(Bucket="bench")
        for mode, durable, pid in (
            ("shared_fs", {"root": tempfile.mkdtemp(prefix="export-lag-shared-")}, None),
            ("object_store", s3.storage_section(), moto.pid),
        ):
            for interval in (a.interval, 10 * a.seconds):
                r = asyncio.run(run_once(mode, durable, interval, a.seconds, a.mb_per_s, pid))
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        moto.terminate()
        moto.wait(10)
    print(f"\nload: {os.getloadavg()}")
    print(
        f"{'mode':13} {'interval':>8} {'MB/s in':>8} {'CPU/s':>6} {'moto CPU/s':>10} {'MB/s up':>8} "
        f"{'seg/s':>6} {'lag p50':>8} {'p99':>6} {'max':>6}"
    )
    for r in results:
        moto = f"{r['moto_cpu_per_s']:.3f}" if r["moto_cpu_per_s"] is not None else "-"
        lag = (
            f"{r['lag_median_s']:8.2f} {r['lag_p99_s']:6.2f} {r['lag_max_s']:6.2f}"
            if r["lag_median_s"] is not None
            else f"{'-':>8} {'-':>6} {'-':>6}"
        )
        print(
            f"{r['mode']:13} {r['interval']:8.0f} {r['appended_mb_per_s']:8.2f} {r['cpu_per_s']:6.3f} {moto:>10} "
            f"{r['uploaded_mb_per_s']:8.2f} {r['segments_per_s']:6.2f} {lag}"
        )
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"export_lag-{int(time.time())}.json"), "w") as f:
        json.dump({"args": vars(a), "load": os.getloadavg(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
