"""What every danube Spark job shares: the session, source options and their CLI flags."""

from __future__ import annotations

import argparse
import os
from typing import Sequence


def add_source_arguments(parser: argparse.ArgumentParser, *, default_topic: str | None = None) -> None:
    src = parser.add_argument_group("source")
    src.add_argument("--root", required=True,
                     help="durable root holding the segments: a directory or s3://bucket/prefix")
    src.add_argument("--topic", default=default_topic, required=default_topic is None,
                     help="topic to read, /namespace/topic" + (f" (default {default_topic})" if default_topic else ""))
    src.add_argument("--metadata", help="metadata database (catalog of segment descriptors); default: the "
                                        "segment sidecars under --root")
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


def source_options(args) -> dict[str, str]:
    """Data source options from the parsed source arguments."""
    opts = {"topic": args.topic, **s3_options(args)}
    if args.metadata:
        opts["metadata"] = args.metadata
        opts["metadataPrefix"] = args.metadata_prefix
    for flag, name in (("start_offset", "startOffset"), ("end_offset", "endOffset"),
                       ("start_time", "startTime"), ("end_time", "endTime")):
        value = getattr(args, flag, None)
        if value is not None:
            opts[name] = str(value)
    return opts


def read_topic(spark, args):
    reader = spark.read.format("danube")
    for key, value in source_options(args).items():
        reader = reader.option(key, value)
    return reader.load(args.root)


def get_session(app_name: str, master: str | None = None, conf: Sequence[str] = ()):
    """A SparkSession with the danube data source registered.

    Under ``spark-submit`` the submitted master and settings win; run directly
    (``danube spark ...``) it defaults to ``local[*]``. Session time zone is UTC so
    timestamps in outputs do not depend on the machine.
    """
    from pyspark.sql import SparkSession

    import danube.spark

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--conf {item!r}: expected KEY=VALUE")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    danube.spark.register(spark)
    return spark
