"""`danube produce`, `danube consume` and `danube bench` as subprocesses against a broker subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tests.support.broker import running_broker
from tests.support.ports import free_port
from tests.support.waiting import wait_until

DANUBE = [sys.executable, "-m", "danube.cli.main"]


@pytest.fixture(scope="module")
def broker():
    with running_broker("--sync", "interval") as b:
        yield b


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*DANUBE, *args], capture_output=True, text=True, timeout=timeout)


def test_produce_then_consume_with_a_subscription_made_first(broker):
    topic = f"/default/cli-{uuid.uuid4().hex[:8]}"
    # Subscribe first (a new subscription starts at the latest offset), with no messages yet.
    first = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "s",
        "--count",
        "1",
        "--timeout",
        "0.5",
    )
    assert first.returncode == 3, first.stderr
    assert "only 0 of 1" in first.stderr
    produced = run("produce", "--service-url", broker.url, "--topic", topic, "--count", "250", "--size", "64")
    assert produced.returncode == 0, produced.stderr
    assert "produced 250 messages of 64 bytes" in produced.stdout
    consumed = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "s",
        "--count",
        "250",
        "--timeout",
        "10",
    )
    assert consumed.returncode == 0, consumed.stderr
    assert "consumed 250 messages (16000 bytes)" in consumed.stderr
    # everything was acked: nothing more for this subscription
    again = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "s",
        "--count",
        "1",
        "--timeout",
        "0.5",
    )
    assert again.returncode == 3


def test_consume_from_earliest_reads_what_was_produced_before_it(broker):
    """The README's produce-then-consume: a subscription created with --from earliest starts at the
    oldest message; the default (latest, as Danube) sees only what comes after it subscribed."""
    topic = f"/default/cli-{uuid.uuid4().hex[:8]}"
    produced = run("produce", "--service-url", broker.url, "--topic", topic, "--count", "40", "--message", "m")
    assert produced.returncode == 0, produced.stderr
    latest = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "late",
        "--count",
        "1",
        "--timeout",
        "0.5",
    )
    assert latest.returncode == 3 and "only 0 of 1" in latest.stderr
    earliest = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "replay",
        "--from",
        "earliest",
        "--count",
        "40",
        "--timeout",
        "10",
        "--print",
    )
    assert earliest.returncode == 0, earliest.stderr
    assert earliest.stdout.splitlines() == ["m"] * 40
    # an existing subscription keeps its cursor: --from earliest again replays nothing acked
    again = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "replay",
        "--from",
        "earliest",
        "--count",
        "1",
        "--timeout",
        "0.5",
    )
    assert again.returncode == 3
    bad = run("consume", "--service-url", broker.url, "--topic", topic, "--subscription", "x", "--from", "oldest")
    assert bad.returncode == 2 and "--from" in bad.stderr


def test_consume_prints_text_payloads_on_shared_subscription(broker):
    topic = f"/default/cli-{uuid.uuid4().hex[:8]}"
    assert (
        run(
            "consume",
            "--service-url",
            broker.url,
            "--topic",
            topic,
            "--subscription",
            "sh",
            "--subscription-type",
            "shared",
            "--timeout",
            "0.2",
        ).returncode
        == 0
    )
    produced = run(
        "produce", "--service-url", broker.url, "--topic", topic, "--count", "3", "--message", "hello", "--rate", "100"
    )
    assert produced.returncode == 0, produced.stderr
    consumed = run(
        "consume",
        "--service-url",
        broker.url,
        "--topic",
        topic,
        "--subscription",
        "sh",
        "--subscription-type",
        "shared",
        "--count",
        "3",
        "--timeout",
        "10",
        "--print",
    )
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout.splitlines() == ["hello"] * 3


def test_bad_options_and_unreachable_broker_exit_codes(broker):
    bad = run("produce", "--count", "0")
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr
    bad = run("produce", "--service-url", broker.url, "--topic", "no-namespace", "--count", "1")
    assert bad.returncode == 1 and "error:" in bad.stderr and "no-namespace" in bad.stderr
    bad = run("consume", "--subscription-type", "round-robin")
    assert bad.returncode == 2


def test_broker_refuses_one_port_for_two_listeners(tmp_path):
    data_dir = tmp_path / "data"
    port = str(free_port())
    bad = run(
        "broker",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--admin-port",
        port,
        "--metrics-port",
        "0",
        "--data-dir",
        str(data_dir),
        timeout=30,
    )
    assert bad.returncode == 2
    assert f"port {port} is given as both the client and the admin port" in bad.stderr
    assert not data_dir.exists()  # refused before anything was created


def test_bench_reports_json(broker):
    result = run(
        "bench",
        "--service-url",
        broker.url,
        "--duration",
        "2",
        "--json",
        "--no-progress",
        "--batch-size",
        "200",
        "--broker-pid",
        str(broker.proc.pid),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["acked"] > 0 and report["delivered"] == report["acked"]
    assert report["end_to_end_rate"] > 0
    for key in ("p50", "p99", "max"):
        assert report["ack_latency_ms"][key] >= 0
        assert report["deliver_latency_ms"][key] >= 0
    assert report["errors"] == []
    # the broker's CPU from /proc over the run, per acked message and per send_batch call
    assert report["broker_cpu_s"] > 0 and report["calls_per_s"] > 0
    assert report["broker_cpu_us_per_call"] == pytest.approx(report["broker_cpu_us_per_msg"] * 200, rel=0.05)
    assert report["broker_threads"] >= 1
    machine = report["machine"]  # how busy the machine was over the measured window
    assert machine["load_before"] is not None and 0.0 <= machine["steal_pct"] <= 100.0
    assert "io_pressure_pct" in machine  # None where the kernel has no /proc/pressure


def test_bench_text_output_mentions_percentiles(broker):
    result = run(
        "bench",
        "--service-url",
        broker.url,
        "--duration",
        "1",
        "--no-progress",
        "--rate",
        "20000",
        "--batch-size",
        "100",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "end to end" in result.stdout and "publish->deliver" in result.stdout and "p99" in result.stdout
    assert "send_batch/s" in result.stdout and "broker CPU" not in result.stdout  # no pid given
    assert "machine: load average" in result.stdout and "CPU steal" in result.stdout
    # delivery counted: the paced schedule's 20,000 messages, each made and delivered
    assert "offered 20,000  sent 20,000" in result.stdout, result.stdout
    assert "delivered    20,000 of 20,000 sent (100.00%), none missing" in result.stdout, result.stdout


POLLER_IO = "-event_engine_client,-event_engine_listener"  # the tuning docs/benchmarks.md measures


def test_broker_and_bench_run_on_grpcs_poller_io():
    """The documented GRPC_EXPERIMENTS tuning is valid for the pinned grpc and the broker says it ran."""
    env = {"GRPC_EXPERIMENTS": POLLER_IO}
    with running_broker("--sync", "always", env=env) as b:
        result = subprocess.run(
            [
                *DANUBE,
                "bench",
                "--service-url",
                b.url,
                "--duration",
                "1",
                "--json",
                "--no-progress",
                "--batch-size",
                "200",
                "--rate",
                "20000",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **env},
        )
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["acked"] > 0 and report["delivered"] == report["acked"]
        assert report["errors"] == []
        log = b.log()
    assert f"GRPC_EXPERIMENTS={POLLER_IO}" in log
    assert "Unknown experiment" not in log and "Unknown experiment" not in result.stderr


def test_broker_logs_grpcs_defaults_when_untuned(monkeypatch):
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("DANUBE_MALLOC_TUNING", raising=False)
    with running_broker("--sync", "interval") as b:
        # the line comes just after the port opens: give it a moment
        wait_until(lambda: "GRPC_EXPERIMENTS=" in b.log(), what="the broker's start-up line")
        log = b.log()
    assert "GRPC_EXPERIMENTS=(grpc's defaults)" in log
    # the broker process tunes glibc malloc for its large per-batch buffers (danube/_allocator.py)
    assert "glibc malloc: mmap_threshold 16 MiB, trim_threshold 64 MiB" in log or "not glibc" in log
