"""Crash safety: a child appending with sync='always' is SIGKILLed at random moments;
every offset it reported durable must be readable and intact after reopen."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

from danube.wal import Wal
from tests.support.processes import stop_process
from tests.unit.wal.crash_child import payload

CHILD = os.path.join(os.path.dirname(__file__), "crash_child.py")


def _kill_loop(path, kills: int, seed: int) -> int:
    rng = random.Random(seed)
    durable = -1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.getcwd(), env.get("PYTHONPATH", "")] if p)
    for _ in range(kills):
        proc = subprocess.Popen([sys.executable, CHILD, str(path)], stdout=subprocess.PIPE, env=env)
        try:
            first_line = proc.stdout.readline()  # the child opened (and recovered) the log
            assert first_line.startswith(b"open "), first_line
            assert int(first_line.split()[1]) >= durable + 1
            time.sleep(rng.uniform(0.0, 0.3))
            proc.kill()  # SIGKILL at a random moment
            out, _ = proc.communicate(timeout=30)
        finally:
            stop_process(proc)
        lines = out.split(b"\n")
        complete = [int(x) for x in lines[:-1] if x]  # the last, unterminated line may be torn
        if complete:
            durable = max(durable, complete[-1])
        with Wal.open(path, sync="never") as wal:
            assert wal.next_offset >= durable + 1
            records = wal.read(0, max_records=durable + 1)
            assert [r.offset for r in records] == list(range(durable + 1))
            for r in records:
                assert bytes(r.payload) == payload(r.offset)
    return durable


def test_sigkill_never_loses_a_durable_offset(tmp_path):
    durable = _kill_loop(tmp_path / "w", kills=5, seed=1)
    assert durable > 0


@pytest.mark.slow
def test_sigkill_many_times(tmp_path):
    durable = _kill_loop(tmp_path / "w", kills=60, seed=2)
    assert durable > 100
