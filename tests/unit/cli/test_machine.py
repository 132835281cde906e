"""danube/cli/_machine.py: the machine-state line printed by danube bench and under the peer table."""

from __future__ import annotations

import sys
import time

import pytest

from danube.cli._machine import MachineCounters, describe, observe, summary


def test_steal_and_pressure_are_shares_of_cpu_and_wall_time():
    before = MachineCounters(total=1_000, steal=10, cpu_pressure_us=5_000_000, io_pressure_us=1_000_000)
    after = MachineCounters(total=1_400, steal=34, cpu_pressure_us=5_300_000, io_pressure_us=1_050_000)
    state = summary(before, after, 2.0, 1.5, 2.25)
    assert state == {
        "load_before": 1.5,
        "load_after": 2.25,
        "steal_pct": 6.0,
        "cpu_pressure_pct": 15.0,
        "io_pressure_pct": 2.5,
    }
    assert describe(state) == (
        "machine: load average 1.5 -> 2.25, CPU steal 6.0%, "
        "CPU pressure (some) 15.0% of the time, I/O pressure (some) 2.5%"
    )


def test_missing_readings_are_none_not_zero():
    state = summary(None, None, 1.0, None, None)
    assert state["steal_pct"] is None and state["cpu_pressure_pct"] is None
    assert describe(state) == "machine: not measurable here"
    no_psi = summary(MachineCounters(100, 0, None), MachineCounters(200, 0, None), 1.0, 0.5, 0.5)
    assert no_psi["steal_pct"] == 0.0 and no_psi["cpu_pressure_pct"] is None
    assert no_psi["io_pressure_pct"] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_observe_reads_this_machine():
    with observe() as state:
        time.sleep(0.1)  # /proc/stat counts in 10 ms ticks: the block must span several
    assert state["load_before"] is not None and state["steal_pct"] is not None
    assert 0.0 <= state["steal_pct"] <= 100.0
