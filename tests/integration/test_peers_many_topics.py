"""bench/peers/many_topics.py against real nats-server and redis-server, a tiny shape for a second
each: every acked message delivered, each server's CPU read from /proc (the figures themselves are
for docs/benchmarks.md, not asserted).  Opt-in (-m slow), and skipped without the peers
(bash bench/peers/setup.sh installs them)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSING = [b for b in ("nats-server", "redis-server") if shutil.which(b) is None] + [
    m for m in ("nats", "redis") if importlib.util.find_spec(m) is None
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=f"peers not installed ({', '.join(MISSING)}): bash bench/peers/setup.sh"),
    pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc"),
]


def test_nats_and_redis_run_the_many_topics_shape(tmp_path):
    out = tmp_path / "peers.json"
    cmd = [sys.executable, "-m", "bench.peers.many_topics", "--only", "nats", "--only", "redis", "--sync", "never"]
    cmd += ["--topics", "4", "--connections", "2", "--rate", "400", "--pace-ms", "10", "--duration", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT])}
    proc = subprocess.run(
        cmd + ["--json-out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert sorted((r["system"], r["topics"]) for r in rows) == [("nats", 1), ("nats", 4), ("redis", 1), ("redis", 4)]
    for r in rows:
        assert r["errors"] == [], r
        assert r["acked"] > 0 and r["delivered"] == r["acked"], r
        # 1 topic: 1 producer at 400 msgs/s, 4 a call; 4 topics: 4 producers, 1 a call
        assert r["messages_per_call"] == (4 if r["topics"] == 1 else 1), r
        assert r["threads"] >= 1 and r["cpu_us_msg"] >= 0, r  # the server's own process was read in /proc
        assert r["p99_ms"] is not None and r["p50_ms"] <= r["p99_ms"], r
