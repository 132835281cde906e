"""Segment → DataFrame decode throughput per core, against a plain-Python per-record reader.

    python bench/spark_decode.py [--mib 64] [--payload 512] [--no-spark]

Writes segments with ``segment.write_segment`` into a temporary directory, then
measures on ONE core, in the same run and over the same bytes:

baseline
    a plain-Python per-record reader: reads each segment file, then ``struct.unpack_from`` per header and
    body field, one tuple per record with key, attribute dict and payload bytes.
    It does not verify checksums (CRC32C is not in the standard library), which
    favours the baseline.
decode
    the data source's executor path (``danube.spark.reading.read_batches``):
    the segment file mapped read-only, etag check, CRC32C of every frame, offset-sequence check,
    ``frames.decode_columns`` and the Arrow RecordBatch the data source yields.
spark
    ``spark.read.format("danube") ... write.format("noop")`` on ``local[1]``:
    the same path plus Spark's Python worker and Arrow transfer to the JVM
    (skipped with --no-spark).
spark baseline
    the plain-Python per-record reader wrapped as a Python data source with the
    same schema (one partition per segment file, one row tuple per record),
    through the same ``local[1]`` → noop path: segment → DataFrame, like for like.

Targets (issue 5): decode ≥ 5× the baseline and ≥ 100 MB/s per core; through
Spark, the data source is compared with the spark baseline.
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

from danube import _native, frames
from danube.spark import planning
from danube.spark.reading import read_batches
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
            size += 16 + 22 + payload_size + (len(key) if key else 0)
        data = frames.encode_records(records, base_offset=offset)
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
        key = bytes(mv[p:p + key_len]).decode() if flags & 1 else None
        p += key_len
        attrs = {}
        for _ in range(attr_count):
            (nl,) = _U16.unpack_from(mv, p)
            name = bytes(mv[p + 2:p + 2 + nl]).decode()
            p += 2 + nl
            (vl,) = _U32.unpack_from(mv, p)
            attrs[name] = bytes(mv[p + 4:p + 4 + vl]).decode()
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
                yield (TOPIC, offset, datetime.datetime.fromtimestamp(publish_time / 1000, tz=utc),
                       producer_id, key, attrs, payload)

    class PlainPythonSegments(DataSource):
        @classmethod
        def name(cls):
            return "danube_plain_python_baseline"

        def schema(self):
            return ("topic string, offset long, publish_time timestamp, producer_id long, "
                    "routing_key string, attributes map<string,string>, payload binary")

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="segment data to generate (default 64 MiB)")
    parser.add_argument("--payload", type=int, default=512, help="payload bytes per record (default 512)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="danube-bench-")
    try:
        total = make_segments(root, args.mib << 20, args.payload)
        backend = FilesystemBackend(root)
        descs = seg.list_segments(backend, seg.topic_prefix(TOPIC))
        records = sum(d.record_count for d in descs)
        mb = total / 1e6
        impl = "compiled" if _native.extensions_loaded().get("frame") else "pure-Python"
        print(f"{len(descs)} segments, {records} records, {mb:.1f} MB, payload {args.payload} B, "
              f"codec {impl} (crc32c {frames.crc32c_implementation()})")

        def baseline():
            for d in descs:  # same I/O as the data source: read the segment, then decode
                plain_python_reader(backend.get(d.data_key))

        options = planning.ReadOptions.parse({"path": root, "topic": TOPIC})
        reads = planning.plan(options, descs)

        def decode():
            rows = 0
            for r in reads:
                for batch in read_batches(r, backend):
                    rows += batch.num_rows
            assert rows == records

        t_base = best_of(baseline, args.repeat)
        t_decode = best_of(decode, args.repeat)
        print(f"baseline  plain-Python reader : {mb / t_base:8.1f} MB/s  {records / t_base / 1e6:6.2f} M rec/s")
        print(f"decode    data source (1 core): {mb / t_decode:8.1f} MB/s  {records / t_decode / 1e6:6.2f} M rec/s"
              f"   {t_base / t_decode:5.1f}x baseline")
        ok = mb / t_decode >= 100 and t_base / t_decode >= 5
        if not args.no_spark:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            os.environ["PYSPARK_PYTHON"] = sys.executable
            from pyspark.sql import SparkSession

            import danube.spark

            spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                     .config("spark.sql.shuffle.partitions", "1").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            danube.spark.register(spark)

            def through_spark():
                (spark.read.format("danube").option("topic", TOPIC).load(root)
                 .write.format("noop").mode("overwrite").save())

            spark.dataSource.register(plain_python_source([os.path.join(root, d.data_key) for d in descs]))

            def baseline_through_spark():
                spark.read.format("danube_plain_python_baseline").load().write.format("noop").mode("overwrite").save()

            assert spark.read.format("danube_plain_python_baseline").load().count() == records
            through_spark()  # warm the Python worker
            t_spark = best_of(through_spark, args.repeat)
            t_spark_base = best_of(baseline_through_spark, args.repeat)
            print(f"spark     local[1] → noop      : {mb / t_spark:8.1f} MB/s  {records / t_spark / 1e6:6.2f} M rec/s"
                  f"   {t_spark_base / t_spark:5.1f}x spark baseline")
            print(f"spark baseline (plain rows)    : {mb / t_spark_base:8.1f} MB/s  "
                  f"{records / t_spark_base / 1e6:6.2f} M rec/s")
            ok = ok and mb / t_spark >= 100 and t_spark_base / t_spark >= 5
            spark.stop()
        print("targets (≥ 5x the plain-Python reader, ≥ 100 MB/s per core, in-process"
              + ("" if args.no_spark else " and through Spark") + "):", "met" if ok else "NOT met")
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
