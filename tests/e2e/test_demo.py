"""The README's run command: `danube demo` starts a broker, round-trips messages on both lanes, stops it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_round_trips_both_lanes_and_stops_the_broker():
    proc = subprocess.run(
        [sys.executable, "-m", "danube.cli.main", "demo", "-n", "300", "--batch-messages", "20000"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = re.findall(r"sent (\d+), received and acked (\d+) \(all present, in order\)", proc.stdout)
    assert reports == [("300", "300"), ("20000", "20000")], proc.stdout
    assert "broker stopped with exit code 0" in proc.stdout


def test_demo_rejects_a_bad_topic_with_exit_code_1():
    proc = subprocess.run(
        [sys.executable, "-m", "danube.cli.main", "demo", "-n", "5", "--batch-messages", "0", "--topic", "no-slash"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "demo failed" in proc.stderr
    assert "invalid topic name" in proc.stderr.lower()
