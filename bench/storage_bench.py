"""Durable storage throughput: export and tiered reads, as ratios to local-file reads in the same run.

    python bench/storage_bench.py [--mb 128] [--segment-mb 16] [--payload 1024] [--s3-mb 64] [--no-s3]

For each backend (shared_fs: a directory; object_store: a moto S3 server in its
own process on 127.0.0.1) it measures

* export:  WAL rotated files → segments + descriptors (``SegmentExporter.export_rotated``), MB/s;
* tiered read: every segment streamed by ``DurableHistoryReader`` (range reads,
  prefetch, checks), MB/s;
* baseline: the same frames read from the local WAL files in 4 MiB positioned
  reads and checked with the same codec call (``frames.scan``: CRC32C, lengths,
  offset sequence), MB/s.  The one check only the tiered side does is the
  xxh3-128 etag of every segment read whole (local WAL files have no etag);
* for context, whole-object GETs of the same segments straight from the backend,
  one at a time, on the same path the tiered reader uses (``get_self_checked``:
  no checks at all, not even botocore's response CRC32): the backend's own
  ceiling (for moto, its HTTP server);
* for object_store, the CPU time of the moto server process and of this
  process per MiB read during the timed tiered passes (JSON only): both share
  the machine's cores, so together they bound the tiered rate;

Both sides read from a warm page cache (an untimed pass of each comes first);
the timed passes alternate (local first, then tiered first, ...) and the
reported figures are medians; the read ratio is the median of the per-pair
ratios.  Prints a table plus JSON (all samples) in
``bench/out/storage_bench-<time>.json``.
Targets: shared_fs tiered reads ≥ 70 % of the local-file rate, S3 ≥ 40 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from danube import _native, message_codec  # noqa: E402
from danube.metadata.embedded import EmbeddedMetadataStore  # noqa: E402
from danube.processes import cpu_seconds, free_port, stop_process, wait_for_port  # noqa: E402
from danube.storage.backends import FilesystemBackend, S3Backend  # noqa: E402
from danube.storage.catalog import SegmentCatalog  # noqa: E402
from danube.storage.exporter import SegmentExporter  # noqa: E402
from danube.storage.tiered_reader import DurableHistoryReader  # noqa: E402
from danube.wal import Wal  # noqa: E402

TOPIC = "/bench/storage"
MB = 1024 * 1024
TARGETS = {"shared_fs": 0.70, "object_store": 0.40}


def _fill_wal(path: str, total_bytes: int, segment_bytes: int, payload: int) -> Wal:
    wal = Wal.open(path, sync="never", max_file_bytes=segment_bytes, cache_bytes=0)
    batch_payloads = [os.urandom(payload) for _ in range(max(1, (256 * 1024) // payload))]
    written = 0
    while written < total_bytes:
        buf = bytearray(message_codec.encode_payloads(batch_payloads, publish_time=int(time.time() * 1000)))
        wal.append_frames(buf)
        written += len(buf)
    wal.rotate()
    wal.sync()
    return wal


def _read_local_files(files, chunk: int = 4 * MB) -> int:
    """The baseline: the same frames read from the local WAL files and checked with the same codec call.

    Each file's frames (``data_start`` .. ``size``, byte-identical to its segment)
    are read in ``chunk``-byte positioned reads and run through ``frames.scan``
    with the expected first offset, exactly as the tiered reader checks each of
    its ranges; a frame cut by a chunk end is re-read at the start of the next.
    Returns the frame bytes read.
    """
    total = 0
    for info in files:
        fd = os.open(info.path, os.O_RDONLY)
        try:
            pos, expected = info.data_start, info.first_offset
            while pos < info.size:
                data = os.pread(fd, min(chunk, info.size - pos), pos)
                _count, end_pos, _first, last, reason, _ = message_codec.scan(data, 0, expected, 0)
                if reason not in (message_codec.SCAN_END, message_codec.SCAN_TORN) or end_pos == 0:
                    raise RuntimeError(f"{info.path}: frame check failed at byte {pos + end_pos}")
                pos += end_pos
                total += end_pos
                expected = last + 1
            if expected != info.last_offset + 1:
                raise RuntimeError(f"{info.path}: ended at offset {expected - 1}, not {info.last_offset}")
        finally:
            os.close(fd)
    return total


async def _measure(backend, wal: Wal, metadata, label: str, repeats: int, server_pid: int | None = None) -> dict:
    catalog = SegmentCatalog(metadata, f"/bench-{label}", TOPIC)
    exporter = SegmentExporter(TOPIC, wal, backend, catalog, max_segment_bytes=wal.options.max_file_bytes)
    files = wal.rotated_files()

    t0 = time.perf_counter()
    descs = await exporter.export_rotated()
    export_s = time.perf_counter() - t0
    seg_bytes = sum(d.size for d in descs)

    reader = DurableHistoryReader(backend, catalog, chunk_bytes=4 * MB, prefetch=2)

    def raw_gets() -> int:
        return sum(len(backend.get_self_checked(d.data_key)) for d in descs)

    async def local() -> float:
        t0 = time.perf_counter()
        got = await asyncio.to_thread(_read_local_files, files)
        elapsed = time.perf_counter() - t0
        assert got == seg_bytes, (got, seg_bytes)
        return seg_bytes / MB / elapsed

    cpu = {"server_s": 0.0, "client_s": 0.0, "bytes": 0}

    async def tiered() -> float:
        server0, client0 = cpu_seconds(server_pid), cpu_seconds(os.getpid())
        t0 = time.perf_counter()
        got = 0
        async for piece in reader.stream(catalog.start_offset):
            got += len(piece)
        elapsed = time.perf_counter() - t0
        assert got == seg_bytes, (got, seg_bytes)
        cpu["server_s"] += cpu_seconds(server_pid) - server0
        cpu["client_s"] += cpu_seconds(os.getpid()) - client0
        cpu["bytes"] += got
        return seg_bytes / MB / elapsed

    async def raw() -> float:
        t0 = time.perf_counter()
        await asyncio.to_thread(raw_gets)
        return seg_bytes / MB / (time.perf_counter() - t0)

    # One untimed pass of each first: both sides then read from a warm page cache
    # (and a warm connection pool), the same condition for every timed pass.
    await local()
    await tiered()
    await raw()
    cpu.update(server_s=0.0, client_s=0.0, bytes=0)
    local_rates, tiered_rates, raw_rates, ratios = [], [], [], []
    for i in range(repeats):
        # alternate which side goes first, so drift in machine load hits both alike
        if i % 2 == 0:
            lr = await local()
            tr = await tiered()
        else:
            tr = await tiered()
            lr = await local()
        local_rates.append(lr)
        tiered_rates.append(tr)
        ratios.append(tr / lr)
        raw_rates.append(await raw())
    local_rate = statistics.median(local_rates)
    read_rate = statistics.median(tiered_rates)
    raw_rate = statistics.median(raw_rates)
    read_ratio = statistics.median(ratios)
    return {
        "backend": label,
        "segments": len(descs),
        "bytes": seg_bytes,
        "export_mb_s": seg_bytes / MB / export_s,
        "tiered_read_mb_s": read_rate,
        "local_file_read_mb_s": local_rate,
        "read_ratio": read_ratio,
        "read_ratio_samples": ratios,
        "tiered_read_samples_mb_s": tiered_rates,
        "local_file_read_samples_mb_s": local_rates,
        "backend_raw_get_mb_s": raw_rate,
        "read_ratio_vs_raw_backend": read_rate / raw_rate,
        "export_ratio": (seg_bytes / MB / export_s) / local_rate,
        "tiered_client_cpu_ms_per_mb": 1000 * cpu["client_s"] / (cpu["bytes"] / MB),
        "tiered_server_cpu_ms_per_mb": 1000 * cpu["server_s"] / (cpu["bytes"] / MB) if server_pid else None,
        "target_read_ratio": TARGETS[label],
        "meets_target": read_ratio >= TARGETS[label],
    }


def _start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc)
    except RuntimeError:
        stop_process(proc)
        raise
    return proc


async def main_async(args) -> list[dict]:
    results = []
    work = tempfile.mkdtemp(prefix="danube-storage-bench-")
    moto = None
    try:
        metadata = EmbeddedMetadataStore(os.path.join(work, "metadata.db"))
        wal = _fill_wal(os.path.join(work, "wal-fs"), args.mb * MB, args.segment_mb * MB, args.payload)
        results.append(
            await _measure(FilesystemBackend(os.path.join(work, "shared")), wal, metadata, "shared_fs", args.repeats)
        )
        wal.close()
        if not args.no_s3:
            port = free_port()
            moto = _start_moto(port)
            endpoint = f"http://127.0.0.1:{port}"
            import boto3

            boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id="bench",
                aws_secret_access_key="bench",
            ).create_bucket(Bucket="danube-bench")
            backend = S3Backend("danube-bench", "history", endpoint=endpoint, access_key="bench", secret_key="bench")
            wal = _fill_wal(os.path.join(work, "wal-s3"), args.s3_mb * MB, args.segment_mb * MB, args.payload)
            results.append(await _measure(backend, wal, metadata, "object_store", args.repeats, moto.pid))
            wal.close()
        await metadata.close()
    finally:
        if moto is not None:
            stop_process(moto, 10)
        shutil.rmtree(work, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=128, help="MiB of frames for the shared_fs run (default 128)")
    parser.add_argument("--s3-mb", type=int, default=64, help="MiB of frames for the S3 run (default 64)")
    parser.add_argument("--segment-mb", type=int, default=16, help="WAL file / segment size (default 16)")
    parser.add_argument("--payload", type=int, default=1024, help="payload bytes per message (default 1024)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed read passes of each side, alternated; medians are reported (default 5)",
    )
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 run")
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    header = (
        f"{'backend':<13}{'segments':>9}{'MiB':>8}{'export MB/s':>13}{'tiered MB/s':>13}"
        f"{'local MB/s':>12}{'read ratio':>12}{'target':>8}{'raw GET MB/s':>14}{'vs raw':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['backend']:<13}{r['segments']:>9}{r['bytes'] / MB:>8.0f}{r['export_mb_s']:>13.0f}"
            f"{r['tiered_read_mb_s']:>13.0f}{r['local_file_read_mb_s']:>12.0f}{r['read_ratio']:>11.0%}"
            f"{'  ok' if r['meets_target'] else '  MISS':>8}{r['backend_raw_get_mb_s']:>14.0f}"
            f"{r['read_ratio_vs_raw_backend']:>7.0%}"
        )
    out_dir = os.path.join(HERE, "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"storage_bench-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(
            {
                "args": vars(args),
                "extensions": _native.extensions_loaded(),
                "crc32c": message_codec.crc32c_implementation(),
                "results": results,
            },
            f,
            indent=2,
        )
    print(f"\nwritten {path}")
    return 0 if all(r["meets_target"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
