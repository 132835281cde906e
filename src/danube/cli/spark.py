"""`danube spark <job>`: run a Spark job over topic history (local[*] unless --master is given).

Same arguments as ``spark-submit spark/jobs/<job>.py``; see docs/spark.md.
"""

from __future__ import annotations

import argparse
import importlib

from danube.spark.jobs import JOBS


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "spark",
        help="Spark jobs over stored topic history (reprocess, load-stats)",
        description=__doc__.split("\n\n")[0],
    )
    jobs = parser.add_subparsers(dest="spark_job", metavar="JOB")
    for name, module_name in JOBS.items():
        module = importlib.import_module(module_name)
        job = jobs.add_parser(
            name,
            help=module.__doc__.splitlines()[0].split(": ", 1)[-1],
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(job)
        job.set_defaults(func=module.execute)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])
