"""spark-submit entry point: ``spark-submit spark/jobs/load_stats.py --root ... --output DIR``.

The logic lives in ``danube.spark.jobs.load_stats`` (importable, tested); the
danube package must be installed where the driver and executors run.
"""

import sys

from danube.spark.jobs.load_stats import main

if __name__ == "__main__":
    sys.exit(main())
