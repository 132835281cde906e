"""Segment → DataFrame decode throughput per core, against a plain-Python per-record reader.

    python bench/spark_decode.py [--mib 256] [--payload 512] [--segment-mib 32] [--no-spark]

Writes segments with ``segment.write_segment`` into a temporary directory, then
measures, in the same run and over the same bytes:

(a) in process, one core
    baseline: a plain-Python per-record reader: reads each segment file, then
    ``struct.unpack_from`` per header and body field, one tuple per record with key,
    attribute dict and payload bytes.  It does not verify checksums (CRC32C is not in
    the standard library), which favours the baseline.
    decode: what each Spark task of the data source runs
    (``danube.spark.reading.read_partition``): segment files mapped read-only, etag
    check, CRC32C of every frame, offset-sequence check and the Arrow RecordBatches the
    data source yields.

(b) through Spark ``local[1]`` (one task slot), into the ``noop`` sink
    spark baseline: the plain-Python reader wrapped as a Python data source with the
    same schema (one partition per segment file, one row tuple per record: the way the
    API's documentation writes a source), like for like with
    ``spark.read.format("danube")``; then the danube source with a narrower schema
    (``offset, payload``), ``count()``, ``toArrow()``, ``mapInArrow`` and an empty
    range (the fixed cost of a query: planning in Python workers, job scheduling).

(c) per core
    wall MB/s on one core for (a); for (b) wall MB/s on ``local[1]`` and MB per
    CPU-second: bytes / (CPU time of the Spark JVM + its Python workers), since the JVM
    task thread and the Python worker run at the same time on different cores.

Targets (README, "Benchmarks"): ≥ 5× the plain-Python reader and ≥ 100 MB/s per core, checked
for (a) and, against the spark baseline, for (b).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import struct
import sys
import tempfile
import time

from danube import _native, message_codec
from danube.processes import cpu_seconds
from danube.spark import planning
from danube.spark.reading import read_partition
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend

TOPIC = "/bench/decode"


def make_segments(root: str, total_bytes: int, payload_size: int, segment_bytes: int = 32 << 20) -> int:
    backend = FilesystemBackend(root)
    rng = random.Random(7)
    offset, written = 0, 0
    while written < total_bytes:
        records = []
        size = 0
        while size < min(segment_bytes, total_bytes - written):
            n = offset + len(records)
            key = f"customer-{rng.randrange(10_000)}" if n % 4 else None
            attrs = {"source": "bench", "seq": str(n)} if n % 8 == 0 else None
            payload = rng.randbytes(payload_size)
            records.append((1_700_000_000_000 + n, 7, key, attrs, payload))
            size += message_codec.HEADER_SIZE + message_codec.MIN_BODY + payload_size + (len(key) if key else 0)
        data = message_codec.encode_records(records, base_offset=offset)
        seg.write_segment(backend, TOPIC, data)
        offset += len(records)
        written += len(data)
    return written


def plain_python_reader(buf) -> list[tuple]:
    """The baseline: per-record struct decoding, no checksum."""
    # Built per call so the function pickles by value into a Spark worker (Struct objects do not pickle).
    _HEADER, _FIXED = struct.Struct("<QII"), struct.Struct("<QQBBHH")
    _U16, _U32 = struct.Struct("<H"), struct.Struct("<I")
    mv = memoryview(buf)
    out = []
    pos, n = 0, len(mv)
    while pos < n:
        offset, _crc, body_len = _HEADER.unpack_from(mv, pos)
        b = pos + 16
        publish_time, producer_id, flags, _r, attr_count, key_len = _FIXED.unpack_from(mv, b)
        p = b + 22
        key = bytes(mv[p : p + key_len]).decode() if flags & 1 else None
        p += key_len
        attrs = {}
        for _ in range(attr_count):
            (nl,) = _U16.unpack_from(mv, p)
            name = bytes(mv[p + 2 : p + 2 + nl]).decode()
            p += 2 + nl
            (vl,) = _U32.unpack_from(mv, p)
            attrs[name] = bytes(mv[p + 4 : p + 4 + vl]).decode()
            p += 4 + vl
        end = b + body_len
        out.append((offset, publish_time, producer_id, key, attrs, bytes(mv[p:end])))
        pos = end
    return out


def plain_python_source(paths: list[str]):
    """The baseline reader as a PySpark data source (classes pickled by value into the worker)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class PlainPythonReader(DataSourceReader):
        def __init__(self, files):
            self.files = files

        def partitions(self):
            return [InputPartition(path) for path in self.files]

        def read(self, partition):
            import datetime

            utc = datetime.timezone.utc
            with open(partition.value, "rb") as f:
                buf = f.read()
            for offset, publish_time, producer_id, key, attrs, payload in plain_python_reader(buf):
                yield (
                    TOPIC,
                    offset,
                    datetime.datetime.fromtimestamp(publish_time / 1000, tz=utc),
                    producer_id,
                    key,
                    attrs,
                    payload,
                )

    class PlainPythonSegments(DataSource):
        @classmethod
        def name(cls):
            return "danube_plain_python_baseline"

        def schema(self):
            return (
                "topic string, offset long, publish_time timestamp, producer_id long, "
                "routing_key string, attributes map<string,string>, payload binary"
            )

        def reader(self, schema):
            return PlainPythonReader(paths)

    return PlainPythonSegments


def best_of(fn, repeat: int) -> float:
    """Best wall time of ``repeat`` runs, cyclic GC off (it would tax the baseline's many objects)."""
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
    finally:
        gc.enable()
    return best


def _process_tree(root_pid: int) -> list[int]:
    """``root_pid`` and its descendants (the Spark JVM, its Python daemons and workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class SparkRun:
    """Best wall time of a Spark action, with the CPU seconds the JVM and the Python workers spent in it."""

    def __init__(self, jvm_pid: int) -> None:
        self.jvm_pid = jvm_pid

    def measure(self, fn, repeat: int) -> tuple[float, float, float]:
        fn()  # warm: JIT, Python workers, page cache
        best = None
        for _ in range(repeat):
            before = {pid: cpu_seconds(pid) for pid in _process_tree(self.jvm_pid)}
            t = time.perf_counter()
            fn()
            wall = time.perf_counter() - t
            after = {pid: cpu_seconds(pid) for pid in _process_tree(self.jvm_pid)}
            jvm = after[self.jvm_pid] - before.get(self.jvm_pid, 0.0)
            python = sum(c - before.get(pid, 0.0) for pid, c in after.items() if pid != self.jvm_pid)
            if best is None or wall < best[0]:
                best = (wall, jvm, python)
        return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256, help="segment data to generate (default 256 MiB)")
    parser.add_argument("--payload", type=int, default=512, help="payload bytes per record (default 512)")
    parser.add_argument("--segment-mib", type=int, default=32, help="segment size (default 32 MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="danube-bench-")
    try:
        total = make_segments(root, args.mib << 20, args.payload, args.segment_mib << 20)
        backend = FilesystemBackend(root)
        descs = seg.list_segments(backend, seg.topic_prefix(TOPIC))
        records = sum(d.record_count for d in descs)
        mb = total / 1e6
        impl = "compiled" if _native.extensions_loaded().get("frame") else "pure-Python"
        print(
            f"{len(descs)} segments, {records} records, {mb:.1f} MB, payload {args.payload} B, "
            f"codec {impl} (crc32c {message_codec.crc32c_implementation()})"
        )

        def baseline():
            for d in descs:  # same I/O as the data source: read the segment, then decode
                plain_python_reader(backend.get(d.data_key))

        options = planning.ReadOptions.parse({"path": root, "topic": TOPIC})
        partitions = planning.pack(options, planning.plan(options, descs))

        def decode():
            rows = 0
            for reads in partitions:
                for batch in read_partition(reads, backend):
                    rows += batch.num_rows
            assert rows == records

        t_base = best_of(baseline, args.repeat)
        t_decode = best_of(decode, args.repeat)
        print("(a) in process, one core")
        print(f"    baseline  plain-Python reader      {mb / t_base:8.1f} MB/s  {records / t_base / 1e6:6.2f} M rec/s")
        print(
            f"    decode    data source              {mb / t_decode:8.1f} MB/s  {records / t_decode / 1e6:6.2f} M rec/s"
            f"   {t_base / t_decode:5.1f}x baseline"
        )
        ok_decode = mb / t_decode >= 100 and t_base / t_decode >= 5
        ok_spark = True
        if not args.no_spark:
            ok_spark = run_spark(args, root, descs, records, mb)
        print(
            f"targets (≥ 5x the plain-Python reader, ≥ 100 MB/s per core): in process "
            f"{'met' if ok_decode else 'NOT met'}"
            + ("" if args.no_spark else f"; through Spark local[1] {'met' if ok_spark else 'NOT met'}")
        )
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_spark(args, root: str, descs, records: int, mb: float) -> bool:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import pyarrow as pa
    from pyspark.sql import SparkSession

    import danube.spark

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        danube.spark.register(spark)
        spark.dataSource.register(plain_python_source([os.path.join(root, d.data_key) for d in descs]))
        run = SparkRun(spark.sparkContext._gateway.proc.pid)

        def danube_df(schema=None, **options):
            reader = spark.read.format("danube").option("topic", TOPIC)
            if schema:
                reader = reader.schema(schema)
            for key, value in options.items():
                reader = reader.option(key, value)
            return reader.load(root)

        def to_noop(df):
            df.write.format("noop").mode("overwrite").save()

        def count_batches(batches):
            for batch in batches:
                yield pa.RecordBatch.from_arrays([pa.array([batch.num_rows], pa.int64())], names=["rows"])

        assert spark.read.format("danube_plain_python_baseline").load().count() == records
        assert danube_df().count() == records
        cases = [
            (
                "spark baseline: plain-Python rows → noop",
                lambda: to_noop(spark.read.format("danube_plain_python_baseline").load()),
            ),
            ("danube → noop", lambda: to_noop(danube_df())),
            ("danube packSegments → noop", lambda: to_noop(danube_df(packSegments="true"))),
            ("danube .schema(offset, payload) → noop", lambda: to_noop(danube_df("offset long, payload binary"))),
            ("danube → count()", lambda: danube_df().count()),
            ("danube → toArrow()", lambda: danube_df().toArrow()),
            ("danube → mapInArrow → noop", lambda: to_noop(danube_df().mapInArrow(count_batches, "rows long"))),
        ]
        print("(b) through Spark local[1]            wall MB/s   MB/CPU-s  JVM CPU s  Python CPU s")
        results = {}
        for name, fn in cases:
            wall, jvm, python = run.measure(fn, args.repeat)
            results[name] = wall
            ratio = "" if name == cases[0][0] else f"   {results[cases[0][0]] / wall:5.1f}x spark baseline"
            print(f"    {name:40s} {mb / wall:8.1f}  {mb / (jvm + python):8.1f}   {jvm:8.2f}   {python:8.2f}{ratio}")
        wall, jvm, python = run.measure(lambda: to_noop(danube_df(startOffset=str(records))), args.repeat)
        print(
            f"    fixed cost of one query (empty range): {wall:.2f} s wall, {jvm:.2f} s JVM CPU, "
            f"{python:.2f} s Python CPU"
        )
        base, ours = results[cases[0][0]], results["danube → noop"]
        return mb / ours >= 100 and base / ours >= 5
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
