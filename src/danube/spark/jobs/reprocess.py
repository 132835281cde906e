"""``reprocess``: filter / transform / re-key a topic's history into Parquet or a new topic.

Steps, in order: read the topic (offset/time range pruned on descriptors),
``--filter`` (a Spark SQL boolean expression over the data source columns),
``--payload-expr`` (new payload, cast to binary), ``--key-expr`` (new routing
key, cast to string), ``--compact`` (keep the record with the highest offset
per routing key; records without a key are kept, they cannot be superseded),
then write, ordered by source offset, either Parquet (all columns, source
offsets kept) or a topic's segments (new offsets consecutive from 0, or after
its last segment with ``--append``).

Runnable as ``danube spark reprocess ...`` or ``spark-submit spark/jobs/reprocess.py ...``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass

from danube.spark.jobs.common import (
    NothingFound,
    SourceSummary,
    add_source_arguments,
    get_session,
    inspect_source,
    read_topic,
    resolve_source,
    s3_options,
    size_shuffles,
)
from danube.spark.jobs.progress import StageProgress

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    tr = parser.add_argument_group("transform")
    tr.add_argument(
        "--filter",
        help="keep rows where this Spark SQL expression is true, "
        "e.g. \"routing_key LIKE 'eu-%%' AND size(attributes) > 0\"",
    )
    tr.add_argument("--payload-expr", help='new payload, e.g. "upper(cast(payload AS string))"')
    tr.add_argument("--key-expr", help="new routing key, e.g. \"attributes['customer']\"")
    tr.add_argument("--compact", action="store_true", help="keep only the latest record per routing key")
    out = parser.add_argument_group("output (one of)")
    target = out.add_mutually_exclusive_group(required=True)
    target.add_argument("--output-parquet", metavar="PATH", help="write Parquet here")
    target.add_argument("--output-topic", metavar="/NS/TOPIC", help="write a topic's segments")
    out.add_argument("--output-root", help="durable root for --output-topic (default: --root; same S3 settings)")
    out.add_argument("--output-metadata", help="metadata database to register the new segments in")
    out.add_argument("--append", action="store_true", help="append to existing output (default: replace it)")


def transform(
    df,
    *,
    filter_expr: str | None = None,
    payload_expr: str | None = None,
    key_expr: str | None = None,
    compact: bool = False,
):
    """The reprocessing pipeline on a data source DataFrame (same columns out)."""
    from pyspark.sql import functions as F

    if filter_expr:
        df = df.where(F.expr(filter_expr))
    if payload_expr:
        df = df.withColumn("payload", F.expr(payload_expr).cast("binary"))
    if key_expr:
        df = df.withColumn("routing_key", F.expr(key_expr).cast("string"))
    if compact:
        df = compact_latest(df)
    return df


def compact_latest(df):
    """Latest record (highest offset) per routing key; unkeyed records all stay."""
    from pyspark.sql import functions as F

    columns = df.columns
    keyed = (
        df.where(F.col("routing_key").isNotNull())
        .groupBy("routing_key")
        .agg(F.max_by(F.struct(*columns), F.col("offset")).alias("latest"))
        .select("latest.*")
    )
    return keyed.unionByName(df.where(F.col("routing_key").isNull()))


@dataclass
class ReprocessResult:
    rows_written: int
    output: str
    segments: int = 0


def run(spark, args, progress: StageProgress | None = None, source: SourceSummary | None = None) -> ReprocessResult:
    """Run the pipeline and write its output; :class:`NothingFound` when the input holds no record."""
    resolve_source(args)
    source = source if source is not None else inspect_source(args)
    if source.reads == 0:
        raise NothingFound(source.explain_empty("records"))
    size_shuffles(spark, source.bytes, getattr(args, "conf", ()))
    if progress is not None:
        progress.step("transform and write")
    df = transform(
        read_topic(spark, args),
        filter_expr=args.filter,
        payload_expr=args.payload_expr,
        key_expr=args.key_expr,
        compact=args.compact,
    )
    ordered = df.orderBy("topic", "offset")
    mode = "append" if args.append else "overwrite"
    if args.output_parquet:
        ordered.write.mode(mode).parquet(args.output_parquet)
        rows = spark.read.parquet(args.output_parquet).count()
        return ReprocessResult(rows, args.output_parquet)
    root = args.output_root or args.root
    writer = (
        ordered.select("payload", "routing_key", "attributes", "publish_time", "producer_id")
        .write.format("danube")
        .mode(mode)
        .option("topic", args.output_topic)
    )
    for key, value in s3_options(args).items():
        writer = writer.option(key, value)
    if args.output_metadata:
        writer = writer.option("metadata", args.output_metadata).option("metadataPrefix", args.metadata_prefix)
    writer.save(root)
    from danube.spark.planning import BackendSpec
    from danube.storage import segment as seg

    backend = BackendSpec(root, tuple(sorted(s3_options(args).items()))).open()
    segments = seg.list_segments(backend, seg.topic_prefix(args.output_topic))
    return ReprocessResult(sum(d.record_count for d in segments), f"{root} {args.output_topic}", len(segments))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reprocess", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return execute(args)


def execute(args) -> int:
    resolve_source(args)
    source = inspect_source(args)  # on the driver, before a JVM starts: an empty input fails fast
    if source.reads == 0:
        print(f"reprocess: {source.explain_empty('records')}", file=sys.stderr)
        return 1
    spark = get_session("danube-reprocess", args.master, args.conf)
    with StageProgress(spark, "reprocess") as progress:
        result = run(spark, args, progress, source)
    print(
        f"reprocess: {result.rows_written} records in {result.output}"
        + (f" ({result.segments} segments)" if result.segments else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
