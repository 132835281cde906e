"""bench/scale.py with 200 topics (functional: the script runs and its checks hold; the
per-topic targets that do not depend on the machine's speed are asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# Back in the default suite: the 23 extra threads once seen under full-suite load were topics
# reopened after an idle close that were never closed again (fixed; the bench now waits until every
# topic's WAL is down to its lock file and names the topics and threads still held when one is not).
# About 10 s (up to 20 s with both cores loaded).
pytestmark = [pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scale_bench_with_200_topics(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "scale.py"),
            "--topics",
            "200",
            "--idle-close",
            "1",
            "--skip-ratios",
            "--dir",
            str(tmp_path),
            "--json-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["create_bad_offsets"] == 0
    assert result["recover_bad_offsets"] == 0 and result["check_problem_count"] == 0
    # every topic's WAL was idle-closed (a topic reopened after a suspend used to keep its files
    # and both WAL threads until its next retention check, minutes away)
    assert "idle_unsettled" not in result, f"not every topic was idle-closed: {result.get('idle_unsettled')}"
    idle = result["per_topic_idle"]
    assert idle["disk"] <= 1 << 20  # <= 1 MiB beyond its data per idle reliable topic
    assert idle["fds"] <= 2  # <= 2 descriptors per idle reliable topic
    assert idle["threads"] < 0.1  # no threads per idle topic
    assert result["per_topic_active"]["disk"] <= 1 << 20
