"""``danube spark load-stats`` as a user runs it: on a live three-broker cluster, and from a
virtualenv-like setup where the ``python3`` on PATH is not the one that has danube."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from danube.spark.jobs import load_stats
from tests.integration.spark.helpers import write_history
from tests.support.cluster import local_cluster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

RUN_S = 14  # the cluster reports for this long before the job runs (1 report/s per broker)
EXPORT_S = 1.0


def test_load_stats_on_a_live_cluster_sees_every_exported_report(spark, tmp_path):
    durable = tmp_path / "durable"
    config = tmp_path / "cluster.yml"
    config.write_text(
        json.dumps(
            {"storage": {"mode": "shared_fs", "export_interval_seconds": EXPORT_S, "durable": {"root": str(durable)}}}
        )
    )
    with local_cluster(str(tmp_path / "cluster"), brokers=3, config=str(config)) as cluster:
        started = time.time()
        time.sleep(RUN_S)
        out = str(tmp_path / "stats")
        parser = argparse.ArgumentParser()
        load_stats.add_arguments(parser)
        args = parser.parse_args(["--root", str(durable), "--output", out, "--bucket-seconds", "1"])
        job_started = time.time()
        summary = load_stats.run(spark, args)
        brokers = sorted(p.broker_id for p in cluster.procs)
    assert summary["brokers"] == 3
    # one snapshot per second for every second but the last interval (+ 2 s for the upload and the
    # job's own start): reports older than the export interval are all there
    assert summary["snapshots"] >= (job_started - started) - EXPORT_S - 3, summary
    series = pq.read_table(os.path.join(out, "broker_timeseries")).to_pylist()
    assert sorted({row["broker_id"] for row in series}) == brokers
    newest = max(int(row["bucket_start"].timestamp()) for row in series)
    assert newest >= job_started - EXPORT_S - 3, "the newest exported second is within the interval"
    # the chart: one CPU line and one score line per broker, each with a point per snapshot
    lines = summary["chart_lines"]
    for panel in ("CPU %", "balanced score"):
        assert sorted(label for label, _n in lines[panel]) == brokers, lines
        # a broker's newest reports may still wait for its next export (as the snapshot count above)
        assert all(n >= summary["snapshots"] - EXPORT_S - 4 for _label, n in lines[panel]), lines
    import matplotlib.image

    pixels = matplotlib.image.imread(summary["chart"])
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300
    assert float(np.std(pixels[..., :3])) > 0.05, "the PNG is not blank"


@pytest.mark.slow  # a JVM of its own: ~30 s on an idle machine, minutes on a loaded one
def test_cli_from_a_virtualenv_without_pyspark_python(tmp_path):
    """The ``python3`` on PATH cannot run danube (as for a virtualenv's entry point): the job's
    workers must run the driver's interpreter anyway; progress is one line per stage."""
    from danube.storage.backends import FilesystemBackend

    root = str(tmp_path / "durable")
    write_history(FilesystemBackend(root), "/default/venv", [(0, 300), (300, 300)])
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text("#!/bin/sh\necho 'this python3 has no danube' >&2\nexit 3\n")
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env["PATH"] = f"{fake_bin}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    out = str(tmp_path / "out.parquet")
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "spark",
            "reprocess",
            "--root",
            root,
            "--topic",
            "/default/venv",
            "--compact",
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            "--output-parquet",
            out,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "reprocess: " in proc.stdout and os.path.isdir(out)
    stage_lines = [line for line in proc.stderr.splitlines() if line.startswith("reprocess: ")]
    assert stage_lines and all(" - stage " in line and " task" in line for line in stage_lines), proc.stderr
    assert "[Stage " not in proc.stderr, "Spark's console progress bar is off"
    print(f"reprocess of 600 records from a clean environment: {took:.1f} s; stages:\n" + "\n".join(stage_lines))
