"""``load-stats``: what the load manager saw and would have done, from the load-report history.

Input: the reliable system topic ``/system/load_reports`` (one JSON LoadReport
per record, see danube.cluster.load_report), read through the danube data source.

Reports are grouped into snapshots of ``--bucket-seconds`` (default 30, the
report interval) by their own ``timestamp``; within a snapshot each broker's
latest report counts.  For every snapshot and each assignment strategy (fair,
balanced, weighted_load) the job computes, with ``danube.cluster.scoring``
(the broker's own formulas), the broker ranking, mean / std / CV, the
overloaded and underloaded brokers, and the one move a rebalancing cycle with
``--aggressiveness`` and ``--blacklist`` would have made.  Snapshots are
independent: the rate limit and cooldown that link cycles are not simulated.

Output directory::

    broker_timeseries/   Parquet: bucket_start, broker_id, cpu/memory/disk/network usage, topic_count,
                         total_throughput_mbps, total_message_rate, total_lag_messages, score_<strategy>,
                         rank_<strategy>
    rankings/            Parquet: bucket_start, strategy, rank, broker_id, score
    cluster_balance/     Parquet: bucket_start, strategy, brokers, mean, std, cv, max, min, overloaded,
                         underloaded, threshold, needs_rebalancing
    moves/               Parquet: bucket_start, strategy, topic, from_broker, to_broker, topic_score, cv, threshold
    load_stats.png       chart: per-broker CPU and balanced score, CV per strategy with the threshold
    rebalancing_moves/   Parquet (with --rebalancing-history): one row per move the leader made: timestamp,
                         topic, from_broker, to_broker, outcome, estimated_load, strategy, the leader's own
                         cv_before / cv_after_estimated, and from the reports cv_before (last snapshot that
                         ended before the move), cv_after (first snapshot that started after it), cv_change

``--rebalancing-history`` reads the records of ``/cluster/rebalancing_history/``
(docs/rebalancing.md): a JSON file (a list, ``{"records": [...]}`` or one record
per line, as ``danube admin brokers rebalance-history -o json`` prints), or an
etcd endpoint ``http://HOST:PORT`` read directly.

Runnable as ``danube spark load-stats ...`` or ``spark-submit spark/jobs/load_stats.py ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator

from danube.cluster import scoring
from danube.cluster.load_report import LOAD_REPORTS_TOPIC, LoadReport
from danube.spark.jobs.common import (
    NothingFound,
    SourceSummary,
    add_source_arguments,
    get_session,
    inspect_source,
    read_topic,
    resolve_source,
    size_shuffles,
)
from danube.spark.jobs.progress import StageProgress

REPORT_COLUMNS = (
    "bucket_start",
    "broker_id",
    "timestamp",
    "offset",
    "cpu",
    "memory",
    "disk_io",
    "network_io",
    "topic_count",
    "total_throughput_mbps",
    "total_message_rate",
    "total_lag_messages",
    "report_json",
)
REPORT_SCHEMA = (
    "bucket_start long, broker_id string, timestamp long, offset long, cpu double, memory double, "
    "disk_io double, network_io double, topic_count long, total_throughput_mbps double, "
    "total_message_rate long, total_lag_messages long, report_json string"
)
EVALUATION_SCHEMA = (
    "kind string, bucket_start long, strategy string, broker_id string, rank int, score double, "
    "brokers int, mean double, std double, cv double, max double, min double, "
    "overloaded array<string>, underloaded array<string>, threshold double, "
    "needs_rebalancing boolean, topic string, from_broker string, to_broker string, "
    "topic_score double"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser, default_topic=LOAD_REPORTS_TOPIC)
    st = parser.add_argument_group("statistics")
    st.add_argument(
        "--bucket-seconds",
        type=int,
        default=30,
        help="snapshot width; each broker's latest report in a snapshot counts (default 30)",
    )
    st.add_argument(
        "--aggressiveness",
        choices=sorted(scoring.AGGRESSIVENESS_THRESHOLDS),
        default="balanced",
        help="rebalancing CV threshold: conservative 0.40, balanced 0.30, aggressive 0.20",
    )
    st.add_argument(
        "--blacklist",
        action="append",
        default=[],
        metavar="PATTERN",
        help="topic never moved: exact name or prefix with a trailing * (repeatable)",
    )
    st.add_argument("--min-brokers", type=int, default=2, help="min_brokers_for_rebalance (default 2)")
    st.add_argument(
        "--rebalancing-history",
        default=None,
        metavar="FILE|http://ETCD",
        help="the leader's rebalancing history: report, per move, the CV before and after",
    )
    parser.add_argument("--output", required=True, help="output directory (Parquet tables and load_stats.png)")


# ---------------------------------------------------------------- per-record and per-snapshot functions


def parse_reports(batches: Iterator, bucket_seconds: int) -> Iterator:
    """mapInArrow: (offset, payload) → one flattened row per LoadReport (LoadReport.from_json validates)."""
    import pyarrow as pa

    for batch in batches:
        rows: dict[str, list] = {name: [] for name in REPORT_COLUMNS}
        for offset, payload in zip(batch.column("offset").to_pylist(), batch.column("payload").to_pylist()):
            report = LoadReport.from_json(payload)
            rows["bucket_start"].append(report.timestamp - report.timestamp % bucket_seconds)
            rows["broker_id"].append(report.broker_id)
            rows["timestamp"].append(report.timestamp)
            rows["offset"].append(offset)
            rows["cpu"].append(report.usage("CPU"))
            rows["memory"].append(report.usage("Memory"))
            rows["disk_io"].append(report.usage("DiskIO"))
            rows["network_io"].append(report.usage("NetworkIO"))
            rows["topic_count"].append(len(report.topics))
            rows["total_throughput_mbps"].append(report.total_throughput_mbps)
            rows["total_message_rate"].append(report.total_message_rate)
            rows["total_lag_messages"].append(report.total_lag_messages)
            rows["report_json"].append(report.to_json().decode())
        yield pa.RecordBatch.from_pydict(rows, schema=_report_arrow_schema())


def _report_arrow_schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("bucket_start", pa.int64()),
            ("broker_id", pa.string()),
            ("timestamp", pa.int64()),
            ("offset", pa.int64()),
            ("cpu", pa.float64()),
            ("memory", pa.float64()),
            ("disk_io", pa.float64()),
            ("network_io", pa.float64()),
            ("topic_count", pa.int64()),
            ("total_throughput_mbps", pa.float64()),
            ("total_message_rate", pa.int64()),
            ("total_lag_messages", pa.int64()),
            ("report_json", pa.string()),
        ]
    )


def evaluate_snapshot(bucket_start: int, reports: list[LoadReport], policy: scoring.RebalancePolicy) -> list[dict]:
    """Rankings, balance and the proposed move of one snapshot, for every strategy (plain rows)."""
    out: list[dict] = []
    topics_by_broker = {r.broker_id: r.topics for r in reports}
    for strategy in scoring.STRATEGIES:
        scores = scoring.broker_scores(strategy, reports)
        for position, (broker, score) in enumerate(scoring.rank(scores), start=1):
            out.append(
                {
                    "kind": "rank",
                    "bucket_start": bucket_start,
                    "strategy": strategy,
                    "broker_id": broker,
                    "rank": position,
                    "score": score,
                }
            )
        stats = scoring.imbalance(scores)
        needed = len(scores) >= max(policy.min_brokers, 2) and stats.needs_rebalancing(policy.threshold)
        out.append(
            {
                "kind": "balance",
                "bucket_start": bucket_start,
                "strategy": strategy,
                "brokers": len(scores),
                "mean": stats.mean,
                "std": stats.std,
                "cv": stats.cv,
                "max": stats.max,
                "min": stats.min,
                "overloaded": list(stats.overloaded),
                "underloaded": list(stats.underloaded),
                "threshold": policy.threshold,
                "needs_rebalancing": needed,
            }
        )
        move = scoring.propose_move(scores, topics_by_broker, policy)
        if move is not None:
            out.append(
                {
                    "kind": "move",
                    "bucket_start": bucket_start,
                    "strategy": strategy,
                    "topic": move.topic,
                    "from_broker": move.from_broker,
                    "to_broker": move.to_broker,
                    "topic_score": move.topic_score,
                    "cv": move.cv,
                    "threshold": policy.threshold,
                }
            )
    return out


def _evaluate_group(policy: scoring.RebalancePolicy):
    def evaluate(pdf):
        import pandas as pd

        reports = [LoadReport.from_json(raw) for raw in pdf["report_json"]]
        rows = evaluate_snapshot(int(pdf["bucket_start"].iloc[0]), reports, policy)
        columns = [c.split()[0] for c in EVALUATION_SCHEMA.split(", ")]
        return pd.DataFrame([{c: row.get(c) for c in columns} for row in rows], columns=columns)

    return evaluate


# ---------------------------------------------------------------- rebalancing history: CV before / after each move

MOVE_EFFECT_SCHEMA = (
    "timestamp double, topic string, from_broker string, to_broker string, outcome string, "
    "estimated_load double, strategy string, leader_cv_before double, "
    "leader_cv_after_estimated double, before_bucket long, cv_before double, "
    "after_bucket long, cv_after double, cv_change double"
)


def parse_history(text: str) -> list[dict]:
    """Rebalancing history records from JSON: a list, ``{"records": [...]}`` or one object per line."""
    import json

    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        data = data.get("records", data.get("history", [data]))
    return [dict(r) for r in data]


def read_history(source: str) -> list[dict]:
    """From a JSON file, or from etcd (``http://HOST:PORT``) under /cluster/rebalancing_history/."""
    if source.startswith(("http://", "https://")):
        import asyncio

        from danube.cluster.rebalancing.history import RebalancingHistory
        from danube.metadata.etcd import EtcdMetadataStore

        async def fetch() -> list[dict]:
            store = EtcdMetadataStore(source)
            try:
                return [r.to_dict() for r in await RebalancingHistory(store).records()]
            finally:
                await store.close()

        return asyncio.run(fetch())
    with open(source, encoding="utf-8") as f:
        return parse_history(f.read())


def move_cv_effects(
    balance: list[tuple[int, str, float]], records: list[dict], bucket_seconds: int, default_strategy: str = "balanced"
) -> list[dict]:
    """Per move: the CV of the last snapshot that ended before it and of the first that started after it.

    ``balance``: (bucket_start in Unix seconds, strategy, cv) per snapshot (the cluster_balance table);
    the CV is taken under the strategy the leader used (the record's ``strategy``). A snapshot that
    contains the move's time mixes reports from before and after, so it is neither; None when the
    reports do not reach that far.
    """
    by_strategy: dict[str, list[tuple[int, float]]] = {}
    for start, strategy, cv in balance:
        by_strategy.setdefault(strategy, []).append((int(start), float(cv)))
    for series in by_strategy.values():
        series.sort()
    out = []
    for r in sorted(records, key=lambda r: float(r["timestamp"])):
        ts = float(r["timestamp"])
        strategy = str(r.get("strategy") or default_strategy)
        series = by_strategy.get(strategy, [])
        before = [(b, cv) for b, cv in series if b + bucket_seconds <= ts]
        after = [(b, cv) for b, cv in series if b >= ts]
        b0, cv0 = before[-1] if before else (None, None)
        b1, cv1 = after[0] if after else (None, None)
        out.append(
            {
                "timestamp": ts,
                "topic": str(r["topic"]),
                "from_broker": str(r.get("from_broker", "")),
                "to_broker": str(r.get("to_broker", "")),
                "outcome": str(r.get("outcome", "moved")),
                "estimated_load": float(r.get("estimated_load", 0.0) or 0.0),
                "strategy": strategy,
                "leader_cv_before": _float_or_none(r.get("cv_before")),
                "leader_cv_after_estimated": _float_or_none(r.get("cv_after_estimated")),
                "before_bucket": b0,
                "cv_before": cv0,
                "after_bucket": b1,
                "cv_after": cv1,
                "cv_change": None if cv0 is None or cv1 is None else cv1 - cv0,
            }
        )
    return out


def _float_or_none(value) -> float | None:
    return None if value is None else float(value)


# ---------------------------------------------------------------- the job


def compute(spark, df, *, bucket_seconds: int = 30, policy: scoring.RebalancePolicy | None = None):
    """DataFrames ``broker_timeseries``, ``rankings``, ``cluster_balance``, ``moves`` from a reports DataFrame."""
    policy = policy if policy is not None else scoring.RebalancePolicy()
    from pyspark.sql import functions as F

    if bucket_seconds <= 0:
        raise ValueError("--bucket-seconds must be > 0")
    reports = df.select("offset", "payload").mapInArrow(lambda it: parse_reports(it, bucket_seconds), REPORT_SCHEMA)
    # the latest report of each broker within a snapshot (highest timestamp, then offset)
    latest = (
        reports.groupBy("bucket_start", "broker_id")
        .agg(
            F.max_by(
                F.struct(*[F.col(c) for c in REPORT_COLUMNS]), F.struct(F.col("timestamp"), F.col("offset"))
            ).alias("r")
        )
        .select("r.*")
    ).cache()
    evaluated = (
        latest.groupBy("bucket_start")
        .applyInPandas(_evaluate_group(policy), EVALUATION_SCHEMA)
        .withColumn("bucket_start", F.timestamp_seconds("bucket_start"))
    ).cache()
    rankings = evaluated.where(F.col("kind") == "rank").select("bucket_start", "strategy", "rank", "broker_id", "score")
    balance = evaluated.where(F.col("kind") == "balance").select(
        "bucket_start",
        "strategy",
        "brokers",
        "mean",
        "std",
        "cv",
        "max",
        "min",
        "overloaded",
        "underloaded",
        "threshold",
        "needs_rebalancing",
    )
    moves = evaluated.where(F.col("kind") == "move").select(
        "bucket_start", "strategy", "topic", "from_broker", "to_broker", "topic_score", "cv", "threshold"
    )
    wide = (
        rankings.groupBy("bucket_start", "broker_id")
        .pivot("strategy", list(scoring.STRATEGIES))
        .agg(F.first("score").alias("score"), F.first("rank").alias("rank"))
    )
    for strategy in scoring.STRATEGIES:
        wide = wide.withColumnRenamed(f"{strategy}_score", f"score_{strategy}").withColumnRenamed(
            f"{strategy}_rank", f"rank_{strategy}"
        )
    timeseries = (
        latest.withColumn("bucket_start", F.timestamp_seconds("bucket_start"))
        .drop("report_json", "offset")
        .join(wide, ["bucket_start", "broker_id"], "left")
    )
    return {
        "broker_timeseries": timeseries.orderBy("bucket_start", "broker_id"),
        "rankings": rankings.orderBy("bucket_start", "strategy", "rank"),
        "cluster_balance": balance.orderBy("bucket_start", "strategy"),
        "moves": moves.orderBy("bucket_start", "strategy"),
    }


def write_chart(timeseries_pdf, balance_pdf, path: str, threshold: float) -> dict[str, list[tuple[str, int]]]:
    """Render ``load_stats.png``; returns what each panel shows: ``{y label: [(line label, points)]}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    for broker, group in timeseries_pdf.groupby("broker_id"):
        axes[0].plot(group["bucket_start"], group["cpu"], marker=".", label=str(broker))
        axes[1].plot(group["bucket_start"], group["score_balanced"], marker=".", label=str(broker))
    axes[0].set_ylabel("CPU %")
    axes[0].set_title("Per-broker load (latest report per snapshot)")
    axes[1].set_ylabel("balanced score")
    for strategy, group in balance_pdf.groupby("strategy"):
        axes[2].plot(group["bucket_start"], group["cv"], marker=".", label=strategy)
    axes[2].axhline(threshold, color="red", linestyle="--", label=f"threshold {threshold:.2f}")
    axes[2].set_ylabel("CV (std / mean)")
    axes[2].set_xlabel("snapshot start (UTC)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    # what the chart shows, per panel: (line label, points), for the summary and the tests
    shown = {
        ax.get_ylabel(): [(str(line.get_label()), len(line.get_xdata())) for line in ax.get_lines()] for ax in axes
    }
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return shown


def run(spark, args, progress: StageProgress | None = None, source: SourceSummary | None = None) -> dict:
    """Compute and write the tables and the chart; :class:`NothingFound` when there is no report."""
    step = progress.step if progress is not None else (lambda _label: None)
    resolve_source(args)
    source = source if source is not None else inspect_source(args)
    if source.reads == 0:
        raise NothingFound(source.explain_empty("load reports"))
    size_shuffles(spark, source.bytes, getattr(args, "conf", ()))
    policy = scoring.RebalancePolicy.for_aggressiveness(
        args.aggressiveness, blacklist=tuple(args.blacklist), min_brokers=args.min_brokers
    )
    tables = compute(spark, read_topic(spark, args), bucket_seconds=args.bucket_seconds, policy=policy)
    step("read and group the reports")
    if tables["broker_timeseries"].limit(1).count() == 0:
        raise NothingFound(source.explain_empty("load reports in the selected range"))
    os.makedirs(args.output, exist_ok=True)
    for name, table in tables.items():
        step(f"write {name}")
        table.write.mode("overwrite").parquet(os.path.join(args.output, name))
    step("chart")
    timeseries = spark.read.parquet(os.path.join(args.output, "broker_timeseries")).toPandas()
    balance = spark.read.parquet(os.path.join(args.output, "cluster_balance")).toPandas()
    chart = os.path.join(args.output, "load_stats.png")
    shown = write_chart(timeseries, balance, chart, policy.threshold)
    moves = spark.read.parquet(os.path.join(args.output, "moves")).count()
    summary = {
        "snapshots": int(balance["bucket_start"].nunique()) if len(balance) else 0,
        "brokers": int(timeseries["broker_id"].nunique()) if len(timeseries) else 0,
        "moves": moves,
        "chart": chart,
        "chart_lines": shown,
    }
    if getattr(args, "rebalancing_history", None):
        from pyspark.sql import functions as F

        records = read_history(args.rebalancing_history)
        snapshots = [
            (int(row[0]), row[1], float(row[2]))
            for row in spark.read.parquet(os.path.join(args.output, "cluster_balance"))
            .select(F.unix_timestamp("bucket_start"), "strategy", "cv")
            .collect()
        ]
        effects = move_cv_effects(snapshots, records, args.bucket_seconds)
        (
            spark.createDataFrame(effects, MOVE_EFFECT_SCHEMA)
            if effects
            else spark.createDataFrame([], MOVE_EFFECT_SCHEMA)
        ).write.mode("overwrite").parquet(os.path.join(args.output, "rebalancing_moves"))
        summary["rebalancing_moves"] = len(effects)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="load_stats", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return execute(parser.parse_args(argv))


def execute(args) -> int:
    resolve_source(args)
    source = inspect_source(args)  # on the driver, before a JVM starts: an empty input fails fast
    if source.reads == 0:
        print(f"load-stats: {source.explain_empty('load reports')}", file=sys.stderr)
        return 1
    spark = get_session("danube-load-stats", args.master, args.conf)
    try:
        with StageProgress(spark, "load-stats") as progress:
            summary = run(spark, args, progress, source)
    except NothingFound as exc:
        print(f"load-stats: {exc}", file=sys.stderr)
        return 1
    print(
        f"load-stats: {summary['snapshots']} snapshots, {summary['brokers']} brokers, "
        f"{summary['moves']} proposed moves; tables and {summary['chart']} in {args.output}"
    )
    if "rebalancing_moves" in summary:
        print(
            f"load-stats: {summary['rebalancing_moves']} rebalancing moves with the CV before and after "
            f"in {os.path.join(args.output, 'rebalancing_moves')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
