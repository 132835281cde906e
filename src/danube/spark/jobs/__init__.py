"""Batch jobs over topic history (``danube spark <job>``, ``spark-submit spark/jobs/<job>.py``)."""

JOBS = {"reprocess": "danube.spark.jobs.reprocess", "load-stats": "danube.spark.jobs.load_stats"}
