"""Spark integration: the ``danube`` data source over durable segments, and the batch jobs.

``register(spark)`` makes ``spark.read.format("danube")`` and ``df.write.format("danube")``
available in a session (Python data sources are registered per session).
"""

from __future__ import annotations


def register(spark) -> None:
    """Register the ``danube`` data source with ``spark`` (a SparkSession)."""
    from danube.spark.datasource import DanubeDataSource

    spark.dataSource.register(DanubeDataSource)
    _check_worker_python(spark)


def _check_worker_python(spark) -> None:
    """Warn when a local session's Python workers run another interpreter than this one: from a
    virtualenv that is usually a ``python3`` without danube, and every task would fail with
    ``ModuleNotFoundError: No module named 'danube'``."""
    import logging
    import os
    import shutil
    import sys

    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    worker = shutil.which(sc.pythonExec) or sc.pythonExec
    if os.path.realpath(worker) != os.path.realpath(sys.executable):
        logging.getLogger(__name__).warning(
            "Spark's Python workers run %s, not this interpreter (%s); if danube is not installed there, "
            "tasks fail with ModuleNotFoundError. Set PYSPARK_PYTHON=%s before the session starts "
            "(danube spark ... does so itself)",
            worker,
            sys.executable,
            sys.executable,
        )


__all__ = ["register"]
