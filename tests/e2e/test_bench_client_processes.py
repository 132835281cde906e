"""`danube bench --client-processes N` as a subprocess with its own broker: the shares add up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DANUBE = [sys.executable, "-m", "danube.cli.main"]


def test_two_producer_processes_merge_into_one_result_with_client_cpu():
    rate, duration = 4000, 2.0
    result = subprocess.run(
        [
            *DANUBE,
            "bench",
            "--spawn-broker",
            "--sync",
            "never",
            "--client-processes",
            "2",
            "--topics",
            "4",
            "--connections",
            "4",
            "--rate",
            str(rate),
            "--pace-ms",
            "10",
            "--duration",
            str(duration),
            "--json",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    report = json.loads(result.stdout)
    summary = {k: v for k, v in report.items() if k not in ("config", "machine")}
    assert report["errors"] == [], summary
    assert report["client_processes"] == 2, summary
    # every message made is acked and delivered once: no share counted twice, none lost
    assert report["sent"] == report["acked"] == report["delivered"], summary
    assert report["sent"] == pytest.approx(rate * duration, rel=0.25), summary
    # counted, not inferred from rates: the schedule's messages, all made and none missing
    assert report["offered"] == rate * duration == report["sent"], summary
    assert report["missing"] == 0 and report["delivered_of_sent"] == 1.0, summary
    assert report["pacer_lag_ms"] >= 0, summary
    # one sample per message, from every process
    assert report["deliver_latency_ms"]["count"] == report["delivered"], summary
    assert report["ack_latency_ms"]["count"] == report["calls"], summary  # one per send_batch call
    assert report["messages_per_call"] == 10 and report["calls"] * 10 == report["sent"], summary
    # the client's CPU beside the broker's, over the same window
    assert report["producer_cpu_s"] > 0 and report["consumer_cpu_s"] > 0, summary
    assert report["client_cpu_s"] >= report["producer_cpu_s"] + report["consumer_cpu_s"], summary
    per_msg = report["client_cpu_s"] * 1e6 / report["acked"]
    assert report["client_cpu_us_per_msg"] == pytest.approx(per_msg, rel=0.01), summary
    assert report["broker_cpu_s"] > 0 and report["broker_cpu_us_per_msg"] > 0, summary
    assert 0 < report["broker_cores"] < 2.5, summary  # while calls were made
    assert 0 < report["producer_core_max"] < 1.5 and 0 < report["consumer_core_max"] < 1.5, summary
    assert report["client_cores"] >= report["producer_core_max"], summary
    assert report["setup_s"] > 0, summary
    assert report["limited_by"] in (None, "client", "broker", "machine"), summary
    assert bool(report["limit"]) == (report["limited_by"] is not None), summary


def test_more_producer_processes_than_topics_exit_2_with_a_sentence():
    result = subprocess.run(
        [*DANUBE, "bench", "--spawn-broker", "--client-processes", "3", "--topics", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--client-processes 3 needs at least 3 topics" in result.stderr
    assert result.stdout == ""
