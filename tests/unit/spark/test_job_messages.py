"""What ``danube spark`` says before any Spark starts: an empty input is explained and fails."""

from __future__ import annotations

import argparse

import pytest

from danube import message_codec
from danube.cli import main as cli_main
from danube.cluster.load_report import LOAD_REPORTS_TOPIC
from danube.spark.jobs import common, load_stats
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend


def test_load_stats_with_nothing_exported_says_why_and_writes_nothing(tmp_path, capsys):
    root = tmp_path / "durable"
    root.mkdir()
    out = tmp_path / "out"
    code = cli_main.main(["spark", "load-stats", "--root", str(root), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"no load reports under {root} for {LOAD_REPORTS_TOPIC}" in err
    assert "no segment of it is exported yet" in err
    assert "shared_fs or object_store" in err and "export_interval_seconds" in err
    assert not out.exists(), "no empty chart, no empty tables"


def test_the_newest_exported_offset_is_named_when_the_range_holds_nothing(tmp_path, capsys):
    root = tmp_path / "durable"
    seg.write_segment(
        FilesystemBackend(str(root)), "/default/t", message_codec.encode_payloads([b"x"] * 5, base_offset=0)
    )
    code = cli_main.main(
        [
            "spark",
            "reprocess",
            "--root",
            str(root),
            "--topic",
            "/default/t",
            "--start-offset",
            "5",
            "--output-parquet",
            str(tmp_path / "p"),
        ]
    )
    assert code == 1
    assert "the newest exported offset is 4" in capsys.readouterr().err


def test_data_dir_fills_both_roots_and_a_missing_root_is_a_sentence(tmp_path):
    parser = argparse.ArgumentParser()
    load_stats.add_arguments(parser)
    (tmp_path / "wal").mkdir()
    args = parser.parse_args(["--data-dir", str(tmp_path), "--output", "o"])
    common.resolve_source(args)
    assert (args.root, args.wal_root) == (str(tmp_path / "durable"), str(tmp_path / "wal"))
    with pytest.raises(SystemExit, match="give --root"):
        common.resolve_source(parser.parse_args(["--output", "o"]))


def test_system_topics_are_read_from_every_brokers_history(tmp_path):
    backend = FilesystemBackend(str(tmp_path))
    for broker in ("b-1", "b-2"):
        seg.write_segment(
            backend, f"{LOAD_REPORTS_TOPIC}.{broker}", message_codec.encode_payloads([b"r"], base_offset=0)
        )
    seg.write_segment(backend, "/system/other.b-1", message_codec.encode_payloads([b"r"], base_offset=0))
    parser = argparse.ArgumentParser()
    load_stats.add_arguments(parser)
    args = parser.parse_args(["--root", str(tmp_path), "--output", "o"])
    assert common.topics_to_read(args) == [f"{LOAD_REPORTS_TOPIC}.b-1", f"{LOAD_REPORTS_TOPIC}.b-2"]
    assert common.inspect_source(args).reads == 2


def test_workers_run_this_interpreter_on_a_local_master_unless_told_otherwise():
    import sys

    assert common.worker_python(None, {}, {}) == sys.executable  # danube spark ... (local[*])
    assert common.worker_python("local[2]", {}, {}) == sys.executable
    assert common.worker_python("local[2]", {"spark.pyspark.python": "/opt/py"}, {}) == "/opt/py"
    assert common.worker_python(None, {}, {"PYSPARK_PYTHON": "/usr/bin/python3"}) is None, "the user's choice"
    assert common.worker_python("spark://host:7077", {}, {}) is None, "executors elsewhere: see docs"
    assert common.worker_python(None, {}, {"PYSPARK_GATEWAY_PORT": "1"}) is None, "spark-submit decides"
