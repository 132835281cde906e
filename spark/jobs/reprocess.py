"""spark-submit entry point: ``spark-submit spark/jobs/reprocess.py --root ... --topic ... --output-...``.

The logic lives in ``danube.spark.jobs.reprocess`` (importable, tested); the
danube package must be installed where the driver and executors run.
"""

import sys

from danube.spark.jobs.reprocess import main

if __name__ == "__main__":
    sys.exit(main())
