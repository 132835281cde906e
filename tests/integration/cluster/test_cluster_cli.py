"""`danube cluster up` as a user runs it: one JSON line once ready, SIGTERM stops everything it started."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.cluster import lookup
from tests.support.etcd import requires_etcd
from tests.support.waiting import wait_until

pytestmark = [requires_etcd, pytest.mark.timeout(180)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie of an exited child counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("storage", ["local", "object_store"])
def test_cluster_up_prints_one_json_line_and_stops_everything_on_sigterm(tmp_path, storage):
    if storage == "object_store":
        pytest.importorskip("moto.server")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "cluster",
            "up",
            "--brokers",
            "2",
            "--json",
            "--base-dir",
            str(tmp_path / "c"),
            "--lease-ttl",
            "3",
            "--storage",
            storage,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids = []
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        info = json.loads(line)
        assert len(info["brokers"]) == 2 and info["leader"] in {b["broker_id"] for b in info["brokers"]}
        assert info["etcd"].startswith("http://127.0.0.1:")
        pids = [info["etcd_pid"]] + [b["pid"] for b in info["brokers"]] + ([info["s3_pid"]] if info["s3_pid"] else [])
        assert (info["s3"] is not None) == (storage == "object_store")
        answers = {asyncio.run(lookup(b["url"], "/default/cli"))[1] for b in info["brokers"]}
        assert len(answers) == 1 and answers <= {b["url"] for b in info["brokers"]}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        wait_until(lambda: all(_gone(p) for p in pids), 10, f"every process of the cluster gone: {pids}", 0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:  # only what this test's cluster started, by PID
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
