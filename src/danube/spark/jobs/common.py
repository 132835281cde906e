"""What every danube Spark job shares: the session, source options and their CLI flags."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence


def add_source_arguments(parser: argparse.ArgumentParser, *, default_topic: str | None = None) -> None:
    src = parser.add_argument_group("source")
    src.add_argument(
        "--root",
        help="durable root holding the segments: a directory or s3://bucket/prefix (required unless --data-dir)",
    )
    src.add_argument(
        "--wal-root",
        help="the broker's storage.local_wal_root: also read its WAL files, every "
        "offset after the durable segments (local mode; a stopped broker)",
    )
    src.add_argument("--data-dir", help="a local-mode broker's data directory: --root DIR/durable --wal-root DIR/wal")
    src.add_argument(
        "--topic",
        default=default_topic,
        required=default_topic is None,
        help="topic to read, /namespace/topic" + (f" (default {default_topic})" if default_topic else ""),
    )
    src.add_argument(
        "--metadata",
        help="metadata database (catalog of segment descriptors); default: the segment sidecars under --root",
    )
    src.add_argument("--metadata-prefix", default="", help="storage.metadata_prefix of the broker (default '')")
    src.add_argument("--s3-endpoint", help="S3 endpoint URL (MinIO, moto, ...)")
    src.add_argument("--s3-region")
    src.add_argument("--s3-access-key")
    src.add_argument("--s3-secret-key")
    src.add_argument("--start-offset", type=int)
    src.add_argument("--end-offset", type=int, help="exclusive")
    src.add_argument("--start-time", help="ms since the epoch or ISO-8601 (inclusive)")
    src.add_argument("--end-time", help="ms since the epoch or ISO-8601 (exclusive)")
    spark = parser.add_argument_group("spark")
    spark.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    spark.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")


def s3_options(args) -> dict[str, str]:
    out = {}
    for name in ("endpoint", "region", "access_key", "secret_key"):
        value = getattr(args, f"s3_{name}", None)
        if value:
            out[name] = value
    return out


def resolve_source(args) -> None:
    """Fill ``--root`` / ``--wal-root`` from ``--data-dir``; exit with a sentence when no root is given."""
    data_dir = getattr(args, "data_dir", None)
    if data_dir:
        if not os.path.isdir(data_dir):
            raise SystemExit(f"--data-dir {data_dir}: no directory there")
        args.root = args.root or os.path.join(data_dir, "durable")
        if not args.wal_root and os.path.isdir(os.path.join(data_dir, "wal")):
            args.wal_root = os.path.join(data_dir, "wal")
    if not args.root:
        raise SystemExit(
            "give --root (the durable root: a directory or s3://bucket/prefix) or --data-dir "
            "(a local-mode broker's data directory)"
        )


def source_options(args) -> dict[str, str]:
    """Data source options from the parsed source arguments."""
    opts = {"topic": args.topic, **s3_options(args)}
    if getattr(args, "wal_root", None):
        opts["walRoot"] = args.wal_root
    if args.metadata:
        opts["metadata"] = args.metadata
        opts["metadataPrefix"] = args.metadata_prefix
    for flag, name in (
        ("start_offset", "startOffset"),
        ("end_offset", "endOffset"),
        ("start_time", "startTime"),
        ("end_time", "endTime"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            opts[name] = str(value)
    return opts


def topics_to_read(args) -> list[str]:
    """The durable histories of ``--topic``: the topic itself, and for a system topic (every broker
    writes its own copy, see ``danube.storage.factory.durable_topic``) each broker's
    ``/system/<name>.<broker_id>`` found under the root."""
    topic = args.topic
    if not topic.startswith("/system/"):
        return [topic]
    found = getattr(args, "_topics", None)
    if found is None:
        from danube.spark import planning

        backend = planning.BackendSpec(args.root, tuple(sorted(s3_options(args).items()))).open()
        name = topic.split("/")[2]
        found = set()
        for info in backend.list("system/"):
            parts = info.key.split("/")
            if len(parts) >= 3 and parts[2] == "segments" and (parts[1] == name or parts[1].startswith(name + ".")):
                found.add(f"/system/{parts[1]}")
        if getattr(args, "wal_root", None) and os.path.isdir(os.path.join(args.wal_root, "system", name)):
            found.add(topic)  # its WAL files are read under the topic's own name
        found = sorted(found) or [topic]
        args._topics = found
    return list(found)


def read_topic(spark, args):
    """The source as one DataFrame (several histories of a system topic are read as one)."""
    frame = None
    # Many small segments (a busy topic exports one per export interval) are packed into a few
    # partitions: a Spark task costs tens of milliseconds whatever its size.
    packing = {"packSegments": "true", "minPartitions": str(spark.sparkContext.defaultParallelism)}
    for topic in topics_to_read(args):
        reader = spark.read.format("danube")
        for key, value in dict(source_options(args), topic=topic, **packing).items():
            reader = reader.option(key, value)
        df = reader.load(args.root)
        frame = df if frame is None else frame.unionByName(df)
    return frame


def is_local_master(master: str | None, environ: Mapping[str, str] = os.environ) -> bool:
    """``danube spark`` without ``--master`` (and not under spark-submit) runs ``local[*]``."""
    if master:
        return master.startswith("local")
    return "PYSPARK_GATEWAY_PORT" not in environ


def worker_python(master: str | None, conf: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> str | None:
    """The interpreter to start Spark's Python workers with, when the job must choose it: with a
    local master and no ``PYSPARK_PYTHON``, ``spark.pyspark.python`` if given, else this one
    (Spark would start the ``python3`` on PATH, which in a virtualenv's entry point has no danube)."""
    if not is_local_master(master, environ) or environ.get("PYSPARK_PYTHON"):
        return None
    return conf.get("spark.pyspark.python", sys.executable)


def _conf_items(conf: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--conf {item!r}: expected KEY=VALUE")
        out.append((key.strip(), value))
    return out


def get_session(app_name: str, master: str | None = None, conf: Sequence[str] = ()):
    """A SparkSession with the danube data source registered.

    Under ``spark-submit`` the submitted master and settings win; run directly
    (``danube spark ...``) it defaults to ``local[*]``. Session time zone is UTC so
    timestamps in outputs do not depend on the machine.

    With a local master the Python workers run this very interpreter (``sys.executable``,
    e.g. a virtualenv's, where danube is installed) unless ``PYSPARK_PYTHON`` or
    ``spark.pyspark.python`` says otherwise: Spark would start the ``python3`` on PATH.
    Spark's console progress bar is off (:class:`StageProgress` prints one line per stage).
    """
    from pyspark.sql import SparkSession

    import danube.spark

    items = _conf_items(conf)
    given = dict(items)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]")
    python = worker_python(master, given)
    if python is not None:
        # PySpark reads the workers' interpreter from the environment (the JVM inherits it)
        os.environ["PYSPARK_PYTHON"] = python
        builder = builder.config("spark.pyspark.python", python)
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    # Small inputs: adaptive execution coalesces the shuffle partitions to what the data needs
    builder = builder.config("spark.sql.adaptive.enabled", "true")
    builder = builder.config("spark.sql.adaptive.coalescePartitions.enabled", "true")
    for key, value in items:
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if "spark.sql.shuffle.partitions" in given:
        spark.conf.set("spark.sql.shuffle.partitions", given["spark.sql.shuffle.partitions"])
    danube.spark.register(spark)
    return spark


# ---------------------------------------------------------------- what a job is about to read


class NothingFound(Exception):
    """A job's input holds no record: the message says where it looked and what to check."""


@dataclass
class SourceSummary:
    """What the descriptors (and WAL files) say a job will read, before Spark runs anything."""

    root: str
    topic: str
    reads: int
    bytes: int
    newest_exported: int | None  # end of the topic's durable segments (whatever the range asked)
    wal_root: str | None

    def explain_empty(self, what: str) -> str:
        """Why a job found nothing, and what to check."""
        newest = (
            "no segment of it is exported yet"
            if self.newest_exported is None
            else f"the newest exported offset is {self.newest_exported}"
        )
        where = self.root + (f" (and the WAL files under {self.wal_root})" if self.wal_root else "")
        hint = (
            "is the broker's storage mode shared_fs or object_store, and has export_interval_seconds "
            "passed since they were written? In local mode read the broker's data directory "
            "with --data-dir (or --wal-root)"
        )
        if self.wal_root:
            hint = "does the offset or time range hold any record?"
        return f"no {what} under {where} for {self.topic}; {newest}; {hint}"


def inspect_source(args) -> SourceSummary:
    """Plan the read on the driver (descriptors only, no data): how much there is to read."""
    from danube.spark import planning

    reads: list = []
    newest = None
    wal_root = None
    for topic in topics_to_read(args):
        options = planning.ReadOptions.parse(dict(source_options(args), topic=topic, path=args.root))
        backend = options.backend.open()
        descriptors = planning.list_descriptors(options, backend)
        reads += planning.plan_all(options, backend, descriptors)
        newest = max(
            [d.end_offset for d in descriptors if d.topic == topic] + ([newest] if newest is not None else []),
            default=None,
        )
        wal_root = options.wal_root
    return SourceSummary(
        root=args.root,
        topic=args.topic,
        reads=len(reads),
        bytes=sum(r.byte_end - r.byte_start for r in reads),
        newest_exported=newest,
        wal_root=wal_root,
    )


def size_shuffles(spark, input_bytes: int, conf: Sequence[str] = ()) -> int:
    """Shuffle partitions for ``input_bytes`` of input (unless ``--conf`` set them): one per
    64 MiB, at least the default parallelism, at most Spark's default of 200.  Each shuffle task
    costs tens of milliseconds, so 200 of them per stage turn a few-MB job into tens of seconds."""
    if any(item.partition("=")[0].strip() == "spark.sql.shuffle.partitions" for item in conf):
        return int(spark.conf.get("spark.sql.shuffle.partitions"))
    parallelism = spark.sparkContext.defaultParallelism
    partitions = max(parallelism, min(200, -(-input_bytes // _SHUFFLE_PARTITION_BYTES)))
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    spark.conf.set("spark.sql.adaptive.coalescePartitions.initialPartitionNum", str(partitions))
    return partitions


_SHUFFLE_PARTITION_BYTES = 64 * 1024 * 1024
