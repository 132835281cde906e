"""Spark integration: the ``danube`` data source over durable segments, and the batch jobs.

``register(spark)`` makes ``spark.read.format("danube")`` and ``df.write.format("danube")``
available in a session (Python data sources are registered per session).
"""

from __future__ import annotations


def register(spark) -> None:
    """Register the ``danube`` data source with ``spark`` (a SparkSession)."""
    from danube.spark.datasource import DanubeDataSource

    spark.dataSource.register(DanubeDataSource)


__all__ = ["register"]
